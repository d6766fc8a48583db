# session 44, call 3: the kept folds and PDL re-measured with decode_profile's alternated rounds (no profile before timing); PDL by grid size
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
D="--paths fused --sampler greedy --attention triton --iters 200 --top 2 --rounds 3"
timeout $(left 200) python3 -m models.bench.decode_profile $D --batches 1,16 --norm fold,split --silu-mul fold,split > $OUT/dp_folds.md 2>&1
echo "folds rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_folds.md
timeout $(left 300) python3 -m models.bench.decode_profile $D --batches 1,16,64 --pdl on,off > $OUT/dp_pdl.md 2>&1
echo "pdl rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_pdl.md
for m in 100000 512 100000 512; do left=$(( 480 - ($(date +%s) - T0) )); [ $left -gt 40 ] || break
  PDL_MAX=$m timeout $left python3 models/bench/results/decode-profile-h200/rounds-recheck/dp_pdlgrid.py -- --paths fused --sampler greedy --attention triton --iters 200 --top 1 --rounds 2 --batches 1,16 > $OUT/dp_pdlmax_$m.md 2>&1
  echo "PDL_MAX=$m rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) \| fused|Error" $OUT/dp_pdlmax_$m.md
done
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; echo "done at $(( $(date +%s) - T0 )) s"
