# the pre-norm fold: (1) the one-row configuration search, 0.8B and 2B; (2) in the step, fold against split, today's
# NORM_CONFIGS and the searched; (3) the fold's GPU tests at the searched configurations
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-540}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
timeout 150 python3 -m models.bench.gemv --model qwen3_5-0.8b --parts norm --jobs 16 > $OUT/norm_08b.md 2>/tmp/n1.err
echo "search 0.8b rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
timeout 170 python3 -m models.bench.gemv --model qwen3_5-2b --parts norm --jobs 16 > $OUT/norm_2b.md 2>/tmp/n2.err
echo "search 2b rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
python3 -m scratch.next65.norm_cfgs $OUT/norm_08b.md $OUT/norm_2b.md > $OUT/norm.json; export NORM_JSON=$OUT/norm.json
DP="--paths fused --sampler greedy --attention triton --batches 1 --norm fold,split --rounds 3 --iters 100 --top 8"
R=$(left); [ $R -gt 70 ] && R=70
[ $R -gt 30 ] && timeout $R python3 -m scratch.next65.dp_norm $DP > $OUT/dp_fold_08b_new.md 2>/tmp/d1.err
echo "dp 0.8b new rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); [ $R -gt 90 ] && R=90
[ $R -gt 30 ] && timeout $R python3 -m scratch.next65.dp_norm --model qwen3_5-2b $DP > $OUT/dp_fold_2b_new.md 2>/tmp/d2.err
echo "dp 2b new rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); [ $R -gt 70 ] && R=70
[ $R -gt 30 ] && timeout $R python3 -m models.bench.decode_profile $DP > $OUT/dp_fold_08b_old.md 2>/tmp/d3.err
echo "dp 0.8b old rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left)
[ $R -gt 30 ] && timeout $R python3 -m scratch.next65.pt_norm -m gpu -q -p no:benchmark -p no:cacheprovider -s \
  tests/test_gemv_norm.py > /tmp/t_norm.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cp /tmp/n1.err /tmp/n2.err /tmp/d*.err /tmp/t_norm.log $OUT/ 2>/dev/null
cat $OUT/times.txt; grep -A12 "^| N | K" $OUT/norm_*.md; grep -A6 "^NORM_CONFIGS" $OUT/norm_*.md
grep -E "^\| 1 " $OUT/dp_fold_*.md; grep -E "max \|logit|passed|failed" /tmp/t_norm.log | tail -8; grep -E "^(FAILED|ERROR)" /tmp/t_norm.log | head
