# stop 55, call 3: the server against its engine at 0f6c291+ (the tree of stop 55's start), burst and Poisson, 3 paired rounds
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 560 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads burst,poisson --out $OUT/sh > $OUT/serve_http.log 2>&1
echo "serve_http rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete; find $OUT -name "*.png" -delete
cat $OUT/times.txt; cat $OUT/sh/results.md | cut -c1-900 | head -40
