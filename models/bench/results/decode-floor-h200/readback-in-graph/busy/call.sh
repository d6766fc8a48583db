source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 110 python3 -m pytest -m gpu -q -n 4 -p no:benchmark tests/test_engine_gpu.py tests/test_graph_gpu.py tests/test_traffic_gpu.py -k "logprobs or tiny or overlapped or graph or traffic" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_tests.log
timeout 200 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,16 --prompt-len 512 --gen 256 --rounds 2 --arms host-overlap,host-triton-overlap,resident-triton --host-load 0,0.3,0.6 --out $OUT/busy > $OUT/busy.log 2>&1
echo "busy rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^\| qwen" $OUT/busy/results.md | awk -F'|' '{print $2,$3,$4,"|",$7,"|",$9,"|",$10,"| step",$16,"launch",$19,"wait",$20}'
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
left=$(( 575 - ($(date +%s) - T0) ))
echo "serve_http with ${left} s"
timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 1 --workloads poisson > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^- start|^\| poisson" $OUT/sh/results.md 2>/dev/null || tail -5 $OUT/serve_http.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; rm -rf $OUT/sh/poisson-http $OUT/sh/poisson-engine
