# (1) the serving gate's host column after Step.trusted (c=1, 64); (2) the step at 1/16/64 rows; (3) 2B at one row
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-520}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times3.txt
timeout 240 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,64 \
  --arms host-overlap,host-triton-overlap,resident-triton --rounds 2 --out /tmp/serve > /tmp/serve.log 2>&1
echo "serve rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times3.txt
cp /tmp/serve/results.md $OUT/serve.md 2>/dev/null; tail -30 /tmp/serve.log > $OUT/serve_tail.log
R=$(left); [ $R -gt 130 ] && R=130
[ $R -gt 30 ] && timeout $R python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16,64 \
  --rounds 2 --iters 100 --top 12 > $OUT/dp_08b.md 2>/tmp/dp1.err
echo "dp rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times3.txt
R=$(left)
[ $R -gt 30 ] && timeout $R python3 -m models.bench.decode_profile --model qwen3_5-2b --paths fused --sampler greedy \
  --attention triton --batches 1 --rounds 2 --iters 100 --top 6 > $OUT/dp_2b.md 2>/tmp/dp3.err
echo "dp 2b rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times3.txt
cp /tmp/dp*.err $OUT/ 2>/dev/null
cat $OUT/times3.txt; grep -E "^\| " $OUT/serve.md | cut -c1-400 | head -12; grep -E "^\| (1|16|64) " $OUT/dp_*.md
