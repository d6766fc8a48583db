# session 44, call 5: the delta rule's columns a program at 1 and 16 rows, in one process, alternated rounds
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
BLOCK_VS=64,32,16,8 timeout 200 python3 models/bench/results/decode-profile-h200/delta-rule-columns/dp_blockv.py -- --paths fused --sampler greedy --attention triton --iters 300 --top 1 --rounds 3 --batches 1,16 --pdl on,on,on,on > $OUT/dp_blockv.md 2>&1
echo "rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) \| fused|Error|capture" $OUT/dp_blockv.md
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; echo "done at $(( $(date +%s) - T0 )) s"
