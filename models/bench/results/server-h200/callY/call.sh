# whichever machine comes: issue 25's burst through HTTP, 3 paired rounds (the H200 is the target's card)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(git log --oneline -1 | cut -c1-8)" > $OUT/times.txt
timeout 450 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads burst --out $OUT/sh > $OUT/serve_http.log 2>&1
echo "serve_http rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete; find $OUT -name "*.png" -delete; rm -rf $OUT/sh/*http-round*
cat $OUT/times.txt; grep -E "^- start|^\| (burst|poisson)" $OUT/sh/results.md | cut -c1-700; tail -3 $OUT/serve_http.log
