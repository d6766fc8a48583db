# issue 25: burst through HTTP from one client process (in request order), 3 paired rounds; then poisson if time is left
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(git log --oneline -1 | cut -c1-8)" > $OUT/times.txt
timeout 400 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads burst --out $OUT/sh > $OUT/serve_http.log 2>&1
echo "serve_http burst rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
left=$(( 0 - ($(date +%s) - T0) ))
if [ $left -gt 150 ]; then timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 3 --workloads poisson --out $OUT/po > $OUT/serve_http_po.log 2>&1; echo "serve_http poisson rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; fi
find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete; find $OUT -name "*.png" -delete; rm -rf $OUT/sh/*http-round* $OUT/po/*round* $OUT/po/server-*.log
cat $OUT/times.txt; grep -E "^- start|^\| (burst|poisson)" $OUT/sh/results.md $OUT/po/results.md | cut -c1-900; tail -3 $OUT/serve_http.log
