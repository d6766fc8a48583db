# stop 67 call 1: the held copies' GPU tests, the engine's GPU tests, per-call cost of a held copy
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
timeout 60 python3 scratch/next67/copies.py > $OUT/copies.md 2>&1
echo "copies rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
timeout 150 python3 -m pytest -m gpu -p no:benchmark -q -x tests/test_graph_gpu.py tests/test_executor.py tests/test_held.py > $OUT/gpu_held.log 2>&1
echo "held tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
timeout 330 python3 -m pytest -m gpu -p no:benchmark -q tests/test_engine_gpu.py > $OUT/gpu_engine.log 2>&1
echo "engine tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cat $OUT/times.txt $OUT/copies.md; tail -5 $OUT/gpu_held.log; tail -8 $OUT/gpu_engine.log
