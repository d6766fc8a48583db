# call 1 (stop 54): kernels.sample in three launches (the group-max bound): compiled tests, A/B against the two-launch form, sweep, the step sampled (new, old, greedy), the GPU engine sampled test
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 120 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py tests/test_argmax.py -x -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 200 python3 -m scratch.samp2.ab --sweep > $OUT/ab.md 2>&1; echo "ab rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 40 python3 -m models.bench.sampler --rows 1,16,64 > $OUT/sampler.md 2>&1; echo "sampler bench rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 480 - ($(date +%s) - T0) )); timeout $(( left < 150 ? left : 150 )) python3 -m scratch.samp2.dp --paths fused --sampler full,full-torch,greedy --attention triton --batches 1,16,64 --rounds 2 --iters 50 --top 0 > $OUT/dp.md 2>&1; echo "dp rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 570 - ($(date +%s) - T0) )); [ $left -gt 20 ] && { timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_engine_gpu.py -k "sampl" -rfE > $OUT/engine_tests.log 2>&1; echo "engine sampled test rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt; }
cat $OUT/times.txt; tail -3 $OUT/tests.log; cat $OUT/ab.md; cat $OUT/sampler.md; grep -h "^| 1 \|^| 16\|^| 64\|Error" $OUT/dp.md; tail -3 $OUT/engine_tests.log
