# session 44, call 2: the mixer alone (warps, spills), the profiler's effect, decode_profile A/B in alternated rounds
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
timeout 150 python3 models/bench/results/decode-profile-h200/fewer-kernels/call2/mixer_probe.py > $OUT/mixer_probe.log 2>&1; echo "mixer probe rc=$? at $(( $(date +%s) - T0 )) s"; cat $OUT/mixer_probe.log | grep -v Warn | tail -14
D="--paths fused --sampler greedy --attention triton --iters 200 --top 4 --rounds 3"
timeout $(left 420) python3 -m models.bench.decode_profile $D --batches 1,16,64 --mixer one,three --gate fold,split > $OUT/dp_ab_rounds.md 2>&1
echo "A/B rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_ab_rounds.md
for w in 16 4; do
timeout $(left 560) env MIXER_WARPS=$w python3 models/bench/results/decode-profile-h200/fewer-kernels/call2/dp_warps.py -- --paths fused --sampler greedy --attention triton --iters 200 --top 2 --rounds 2 --batches 1,16,64 --mixer one,three > $OUT/dp_warps$w.md 2>&1
echo "warps $w rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_warps$w.md
done
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; echo "done at $(( $(date +%s) - T0 )) s"
