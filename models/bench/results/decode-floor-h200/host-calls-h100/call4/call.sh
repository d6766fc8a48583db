# per-call cost of the held calls against torch's; the GPU tests of the held calls and the engine; FlashInfer's JIT cache
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-400}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
timeout 60 python3 scratch/next66/calls.py > $OUT/calls.md 2>/tmp/c.err
echo "calls rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); R=$(( R - 40 ))
[ $R -gt 30 ] && timeout $R python3 -m pytest -m gpu -v -p no:benchmark -p no:cacheprovider tests/test_graph_gpu.py \
  tests/test_engine_gpu.py > /tmp/t.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
save_jit_cache; echo "jit saved $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/t.log > $OUT/tests.log; tail -c 3000 /tmp/t.log > $OUT/tests_tail.log
tail -c 800 /tmp/c.err >> $OUT/times.txt
cat $OUT/times.txt $OUT/calls.md $OUT/tests.log | cut -c1-200; ls -la $OUT
