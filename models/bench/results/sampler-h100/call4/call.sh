# call 4: kernels.sample with 16-bit keys for bf16: compiled tests, the bench, the step sampled (kernel at every row count) vs torch ops; the GPU engine sampled test
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 60 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py -x -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 30 python3 -m models.bench.sampler --rows 1,16,64 > $OUT/sampler.md 2>&1; echo "sampler bench rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 70 python3 -m scratch.samp.dp_all --paths fused --sampler full,full-torch --attention triton --batches 1,16,64 --rounds 1 --iters 50 --top 0 > $OUT/dp.md 2>&1; echo "dp rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 165 - ($(date +%s) - T0) )); [ $left -gt 20 ] && { timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_engine_gpu.py -k "sample_kernel" -rfE > $OUT/engine_tests.log 2>&1; echo "engine sampled test rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt; }
cat $OUT/times.txt; tail -4 $OUT/tests.log; cat $OUT/sampler.md; grep -h "^| 1 \|^| 16\|^| 64\|copy moves\|Error" $OUT/dp.md; tail -4 $OUT/engine_tests.log
