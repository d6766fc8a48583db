# stop 55, call 5: the server against its engine at e30ec86+ on whichever card comes (asked for an H200): the burst and
# Poisson, 3 paired rounds (on an H100, the burst alone)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name" > $OUT/times.txt
W=burst; case "$name" in *H200*) W=burst,poisson;; esac
timeout 470 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads $W --out $OUT/sh > $OUT/serve_http.log 2>&1
echo "serve_http $W rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete; find $OUT -name "*.png" -delete; rm -rf $OUT/sh/*http-round*
cat $OUT/times.txt; grep -E "^- start|^\| (burst|poisson)" $OUT/sh/results.md | cut -c1-700; tail -3 $OUT/serve_http.log
