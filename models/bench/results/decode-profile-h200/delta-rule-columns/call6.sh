# session 44, call 6: the delta rule's columns a program at 1, 16 and 64 rows (64 / 32 / 16), and its GPU tests at the new default
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 100 python3 -m pytest -m gpu -q -n 4 -p no:benchmark tests/test_gdn_kernel.py tests/test_decode_kernels.py -k "gdn or conv" > $OUT/gpu_gdn_tests.log 2>&1
echo "gdn tests rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|Error" $OUT/gpu_gdn_tests.log | tail -3
BLOCK_VS=64,32,16 timeout 150 python3 models/bench/results/decode-profile-h200/delta-rule-columns/dp_blockv.py -- --paths fused --sampler greedy --attention triton --iters 200 --top 1 --rounds 3 --batches 1,16,64 --pdl on,on,on > $OUT/dp_blockv.md 2>&1
echo "rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_blockv.md
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; echo "done at $(( $(date +%s) - T0 )) s"
