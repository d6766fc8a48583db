# call 6 (session 43): the weight streams on persistent programs (scratch/dp_persist.py), bits checked, A/B
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 60 python3 scratch/persist_check.py > $OUT/persist_check.log 2>&1; echo "check rc=$? at $(( $(date +%s) - T0 )) s"; tail -2 $OUT/persist_check.log
D="--paths fused --sampler greedy --attention triton --batches 1,16 --top 2 --iters 200"
for r in 1 2; do for wv in 0 2 4; do left=$(( 190 - ($(date +%s) - T0) )); [ $left -gt 25 ] || break
  WAVES=$wv timeout $left python3 scratch/dp_persist.py -- $D > $OUT/dp_w${wv}_$r.md 2>&1
  echo "WAVES=$wv round $r rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) \| fused|Error" $OUT/dp_w${wv}_$r.md | head -3
done; done
