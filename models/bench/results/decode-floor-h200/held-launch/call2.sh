# the call after call.sh (same machine): the GPU tests again with a longer limit (gpu_tests.log), then serve_http's burst (../../server-h200/callQ/)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
timeout 330 python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark tests/test_graph_gpu.py tests/test_engine_gpu.py tests/test_prefill_kernels_gpu.py -rfE --durations=15 > $OUT/gpu_tests.log 2>&1
left=$(( 585 - ($(date +%s) - T0) ))
[ $left -gt 150 ] && timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 2 --workloads burst > $OUT/serve_http.log 2>&1
