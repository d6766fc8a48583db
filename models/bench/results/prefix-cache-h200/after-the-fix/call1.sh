# Next session's first device call (written at stop 39): the split-K regression test on the fix and on the code
# before it, the whole GPU suite (the KV caches are now views of one tensor: FlashInfer, Triton, graphs), the burst
# with and without the cache (the host cuts since 26fa124), the chats once (tokens equal now the bug is fixed).
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 60 python3 -m pytest -q -m gpu tests/test_graph_gpu.py -p no:cacheprovider > $OUT/graph_test.log 2>&1; echo "== graph test (fix) rc=$?"; tail -1 $OUT/graph_test.log
mkdir -p /tmp/old && cp -r resplan kernels models tests pyproject.toml /tmp/old/ && cp -r scratch/old/* /tmp/old/
(cd /tmp/old && timeout 60 python3 -m pytest -q -m gpu tests/test_graph_gpu.py -p no:cacheprovider > $OUT/graph_test_old.log 2>&1; echo "== graph test (before the fix, must fail) rc=$?"); grep -E "passed|failed" $OUT/graph_test_old.log | tail -1
timeout 330 python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark -p no:cacheprovider tests > $OUT/gpu_suite.log 2>&1; echo "== gpu suite rc=$? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/gpu_suite.log
timeout 120 python3 -m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate inf --arms resident-triton,resident-triton-cache,host-triton-overlap --rounds 3 --max-running 64 --no-progress --out $OUT/burst > $OUT/burst.log 2>&1
echo "== burst rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^round" $OUT/burst.log | head -12
