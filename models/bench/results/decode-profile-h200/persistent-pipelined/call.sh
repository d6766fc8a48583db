# call V: the persistent weight stream: its sweep, the decode step A/B with the sweep's picks, its GPU tests; host split
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
timeout 180 python3 -m scratch.pstream.bench /tmp/best.json > $OUT/pstream.txt 2>&1; echo "pstream rc=$? at $(( $(date +%s) - T0 )) s"
grep -vE "^<!--" $OUT/pstream.txt | tail -24; grep -c "^<!--" $OUT/pstream.txt; cp /tmp/best.json $OUT/ 2>/dev/null
[ -f /tmp/best.json ] && timeout 170 python3 -m scratch.pstream.dp /tmp/best.json --paths fused --sampler greedy --attention triton --batches 1,16 --streams grid,persistent --rounds 3 --iters 100 --top 6 > $OUT/dp.txt 2>&1; echo "dp rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^\| (1|16) \|" $OUT/dp.txt
left=$(( 430 - ($(date +%s) - T0) ))
[ $left -gt 40 ] && timeout $left python3 -m pytest -m gpu -q -n 8 -p no:benchmark tests/test_gemv_persistent.py > $OUT/gpu_tests.log 2>&1; echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_tests.log
