# session 44, call 7: block_v_for (the default since) against 64 columns at 1, 16 and 64 rows
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
BLOCK_VS=64,0 timeout 120 python3 models/bench/results/decode-profile-h200/delta-rule-columns/dp_blockv.py -- --paths fused --sampler greedy --attention triton --iters 200 --top 1 --rounds 3 --batches 1,16,64 --pdl on,on > $OUT/dp_blockv_rule.md 2>&1
echo "rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_blockv_rule.md
timeout 60 python3 -m pytest -m gpu -q -p no:benchmark tests/test_gdn_kernel.py > $OUT/gpu_gdn_tests.log 2>&1; echo "gdn tests rc=$?"; tail -1 $OUT/gpu_gdn_tests.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; echo "done at $(( $(date +%s) - T0 )) s"
