# stop 67 call 2: the held copies' GPU tests, the engine's GPU tests (4 workers), serve A/B against ef9dd13
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-570}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
python3 -c "import resplan.held as h; print('new tree held_for:', hasattr(h, 'held_for'), h.__file__)" >> $OUT/times.txt
(cd scratch/next67/base && PYTHONPATH=/tmp/site:$PWD python3 -c "import resplan.held as h; print('base tree held_for:', hasattr(h, 'held_for'), h.__file__)") >> $OUT/times.txt
timeout 100 python3 -m pytest -m gpu -p no:benchmark -q tests/test_graph_gpu.py tests/test_executor.py tests/test_held.py > $OUT/gpu_held.log 2>&1
echo "held tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
timeout 220 python3 -m pytest -m gpu -p no:benchmark -q -n 4 --dist load tests/test_engine_gpu.py > $OUT/gpu_engine.log 2>&1
echo "engine tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
for r in 1 2; do for tree in base new; do
  L=$(left); [ $L -lt 60 ] && break 2
  if [ $tree = base ]; then D=$PWD/scratch/next67/base; else D=$PWD; fi  # (-m imports from the working directory)
  (cd $D && PYTHONPATH=/tmp/site:$D timeout $(( L - 10 )) python3 -m models.bench.serve --model qwen3_5-0.8b \
    --concurrency 1,16 --arms host-triton-overlap,resident-triton --host-load 0,0.6 --rounds 1 --out /tmp/s_${tree}$r \
    > /tmp/s_${tree}$r.log 2>&1)
  echo "serve $tree $r rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/s_${tree}$r/results.md $OUT/serve_${tree}$r.md 2>/dev/null || tail -5 /tmp/s_${tree}$r.log
done; done
cat $OUT/times.txt; tail -3 $OUT/gpu_held.log; tail -4 $OUT/gpu_engine.log
for f in $OUT/serve_*.md; do echo "== $f"; grep -E "^\| qwen" $f | awk -F'|' '{print $2"|"$3"|"$4"|"$7"|"$10"|"$16"|"$19"|"$20"|"$23"|"$24}'; done
