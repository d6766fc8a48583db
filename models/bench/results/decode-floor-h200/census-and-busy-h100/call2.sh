# stop 68 call 2: every arm at c=16 on a busy host; the GPU tests of the executor, the graphs and the held calls
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader) $(date +%T) $(git log --oneline -1 | cut -c1-8)" > $OUT/times.txt
timeout 120 python3 -m pytest -m gpu -q -p no:benchmark tests/test_graph_gpu.py tests/test_executor.py tests/test_held.py -rfE > $OUT/gpu_small.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; tail -3 $OUT/gpu_small.log >> $OUT/times.txt
timeout 400 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 16 \
  --arms host,host-overlap,host-triton-overlap,resident-fa2,resident-xqa,resident-triton --host-load 0,0.3,0.6 \
  --rounds 2 --out $OUT/busy16 > /tmp/busy.log 2>&1
echo "serve rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; tail -3 /tmp/busy.log >> $OUT/times.txt
cat $OUT/times.txt
grep -E "^\| qwen" $OUT/busy16/results.md 2>/dev/null | cut -d'|' -f2-5,7,10,16-26
