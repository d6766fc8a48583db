# call 4 (stop 54): the row's select gathers the tiles' kept keys back to back (the clustered case): compiled tests, A/B old / v2 (fast slots a tile) / new / torch, the GPU engine sampled test (the kernel at 32 float32 rows now), the step
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 150 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py -x -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_engine_gpu.py -k "sampl" -rfE > $OUT/engine_tests.log 2>&1; echo "engine sampled test rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 150 python3 -m scratch.samp2.ab > $OUT/ab.md 2>&1; echo "ab rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 420 - ($(date +%s) - T0) )); [ $left -gt 60 ] && { timeout $left python3 -m scratch.samp2.dp --paths fused --sampler full,full-torch,greedy --attention triton --batches 1,16,64 --rounds 2 --iters 50 --top 0 > $OUT/dp.md 2>&1; echo "dp rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt; }
cat $OUT/times.txt; tail -3 $OUT/tests.log; tail -3 $OUT/engine_tests.log; cat $OUT/ab.md; grep -h "^| 1 \|^| 16\|^| 64\|Error" $OUT/dp.md
