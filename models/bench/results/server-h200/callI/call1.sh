# stop 36 call 1: the 32/64-row weight stream's GPU test (never run), then the burst through HTTP with the delivery metrics
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:benchmark tests/test_gemv_wide_gpu.py > $OUT/gemv_wide_gpu.log 2>&1
echo "gemv wide rc=$? in $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gemv_wide_gpu.log
left=$(( 570 - ($(date +%s) - T0) ))
echo "serve_http with ${left} s"
timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 2 --workloads burst > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? at $(( $(date +%s) - T0 )) s"
cat $OUT/sh/results.md 2>/dev/null | tail -12 || tail -30 $OUT/serve_http.log
grep -h -i "lag\|wake\|beside\|ITL" $OUT/sh/burst-http/results.md 2>/dev/null | head -12
