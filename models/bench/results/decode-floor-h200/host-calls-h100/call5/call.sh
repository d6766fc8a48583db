# the raw stream's GPU test; the serving gate at c=1 on this tree (its host column)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-300}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
timeout 90 python3 -m pytest -m gpu -v -p no:benchmark -p no:cacheprovider tests/test_graph_gpu.py > /tmp/t.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); R=$(( R - 10 ))
[ $R -gt 60 ] && timeout $R python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1 \
  --arms host-overlap,host-triton-overlap,resident-triton --rounds 2 --out /tmp/serve > /tmp/serve.log 2>&1
echo "serve rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cp /tmp/serve/results.md $OUT/serve.md 2>/dev/null; tail -c 2000 /tmp/serve.log > $OUT/serve_tail.log
grep -E "PASSED|FAILED|ERROR|passed|failed" /tmp/t.log > $OUT/tests.log
cat $OUT/times.txt $OUT/tests.log; grep -E "^\| " $OUT/serve.md | cut -c1-420 | head -8
