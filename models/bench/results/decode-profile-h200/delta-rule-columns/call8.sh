# session 44, call 8: the GDN conv step's channels a program at 1 and 16 rows, one process, alternated rounds
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
BLOCK_CS=256,128,64,32 timeout 100 python3 models/bench/results/decode-profile-h200/delta-rule-columns/dp_blockc.py -- --paths fused --sampler greedy --attention triton --iters 300 --top 1 --rounds 3 --batches 1,16 --pdl on,on,on,on > $OUT/dp_blockc.md 2>&1
echo "rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) \| fused|Error" $OUT/dp_blockc.md
