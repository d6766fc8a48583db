# session 44, call 4: whole-slice one-row streams and PDL by grid size, each in its own process, alternated
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
D="--paths fused --sampler greedy --attention triton --iters 300 --top 1 --rounds 3 --batches 1"
for r in 1 2; do for s in 0 1; do left=$(( 200 - ($(date +%s) - T0) )); [ $left -gt 25 ] || break
  SLICE=$s timeout $left python3 models/bench/results/decode-profile-h200/rounds-recheck/dp_slices.py -- $D > $OUT/dp_slice${s}_$r.md 2>&1
  echo "SLICE=$s round $r rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| 1 \| fused|Error" $OUT/dp_slice${s}_$r.md
done; done
for r in 1 2; do for m in 100000 512; do left=$(( 330 - ($(date +%s) - T0) )); [ $left -gt 25 ] || break
  PDL_MAX=$m timeout $left python3 models/bench/results/decode-profile-h200/rounds-recheck/dp_pdlgrid.py -- $D > $OUT/dp_pdlmax${m}_$r.md 2>&1
  echo "PDL_MAX=$m round $r rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| 1 \| fused|Error" $OUT/dp_pdlmax${m}_$r.md
done; done
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; echo "done at $(( $(date +%s) - T0 )) s"
