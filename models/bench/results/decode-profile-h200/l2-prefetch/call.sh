# call 4 (session 43): each weight stream asks the L2 for the next stream's weight (scratch/dp_pf.py), A/B
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 120 python3 scratch/dp_pf.py check > $OUT/check.log 2>&1
echo "check rc=$? at $(( $(date +%s) - T0 )) s"; grep -v "^check.*True" $OUT/check.log | tail -12
D="--paths fused --sampler greedy --attention triton --batches 1,16 --top 3 --iters 200"
for r in 1 2; do for pf in 1 0; do left=$(( 400 - ($(date +%s) - T0) )); [ $left -gt 40 ] || break
  PF=$pf timeout $left python3 scratch/dp_pf.py -- $D > $OUT/dp_pf${pf}_$r.md 2>&1
  echo "PF=$pf round $r rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) \| fused|Error|error" $OUT/dp_pf${pf}_$r.md | head -4
done; done
grep -h "_gemv_kernel\|dp_pf" $OUT/dp_pf1_1.md $OUT/dp_pf0_1.md
echo "done at $(( $(date +%s) - T0 )) s"
