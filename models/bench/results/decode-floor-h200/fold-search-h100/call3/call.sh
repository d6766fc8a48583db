# NORM_CONFIGS at the search's picks (the tree) against the previous 0.8B configs, alternated processes; 2B fold/split;
# the fold's and the engine's GPU tests on the tree
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-150}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times4.txt
DP="--paths fused --sampler greedy --attention triton --batches 1 --norm fold,split --rounds 2 --iters 100 --top 4"
for i in 1 2; do
  NORM_JSON=scratch/next65/old.json timeout 60 python3 -m scratch.next65.dp_norm $DP > /tmp/ab_old$i.md 2>/tmp/ab.err
  timeout 60 python3 -m models.bench.decode_profile $DP > /tmp/ab_new$i.md 2>>/tmp/ab.err
done
echo "ab $(( $(date +%s) - T0 )) s" >> $OUT/times4.txt
timeout 45 python3 -m models.bench.decode_profile --model qwen3_5-2b $DP > /tmp/ab_2b.md 2>>/tmp/ab.err
grep -H -E "^\| 1 " /tmp/ab_*.md > $OUT/ab.txt
tail -c 3000 /tmp/ab.err > $OUT/ab_err.txt; cat $OUT/times4.txt $OUT/ab.txt
