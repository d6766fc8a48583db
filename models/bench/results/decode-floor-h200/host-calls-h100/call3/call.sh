# the host step's CUDA calls through resplan.held (raw stream, held query, held elapsed) against b807f7c: phases
# unwrapped at c=1 and c=64, processes alternated; the GPU tests of the held calls and the engine's overlap/timing
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-420}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
SITE=/tmp/site; P="--c 1,64 --gen 1024,256 --rounds 3 --wrap off"
for i in 1 2 3; do
  R=$(left); [ $R -gt 60 ] && R=60
  [ $R -gt 25 ] && PYTHONPATH=$SITE:$PWD/scratch/next66/base timeout $R python3 scratch/next66/phases.py $P > $OUT/ab_base$i.md 2>/tmp/b$i.err
  echo "base $i rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  R=$(left); [ $R -gt 60 ] && R=60
  [ $R -gt 25 ] && PYTHONPATH=$SITE:$PWD timeout $R python3 scratch/next66/phases.py $P > $OUT/ab_new$i.md 2>/tmp/n$i.err
  echo "new $i rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
done
R=$(left)
[ $R -gt 30 ] && timeout $R python3 -m pytest -m gpu -q -p no:benchmark -p no:cacheprovider tests/test_graph_gpu.py \
  tests/test_engine_gpu.py -x > /tmp/t.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
tail -c 2500 /tmp/t.log > $OUT/tests_tail.log; tail -c 600 /tmp/b1.err > $OUT/err.txt; tail -c 600 /tmp/n1.err >> $OUT/err.txt
cat $OUT/times.txt; grep -H "^##" $OUT/ab_*.md | sed 's/.*\/ab_//' | cut -c1-260; tail -5 /tmp/t.log; cat $OUT/err.txt | tail -5
