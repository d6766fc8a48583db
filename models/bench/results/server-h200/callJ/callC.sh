source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 380 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 2 --workloads burst,poisson > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? in $(( $(date +%s) - T0 )) s"
tail -6 $OUT/sh/results.md 2>/dev/null || tail -30 $OUT/serve_http.log
grep -i "ready\|first" $OUT/sh/results.md | head -5
left=$(( 560 - ($(date +%s) - T0) ))
echo "cache burst with ${left} s"
timeout $left python3 -m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate inf --arms resident-triton,resident-triton-cache --rounds 2 --max-running 64 --no-progress --out $OUT/cache_burst > $OUT/cache_burst.log 2>&1
echo "cache burst rc=$? at $(( $(date +%s) - T0 )) s"; grep "^round" $OUT/cache_burst.log
grep -E "^\| resident-triton-cache" $OUT/cache_burst/results.md | awk -F'|' '{print $6, $(NF-5), $(NF-4), $(NF-3)}'
