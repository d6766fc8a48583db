# call 5 (stop 54): a LOGPROBS step's draw sums the rows' log-sum-exp in the kernel: compiled lse test and a subset, the GPU engine logprobs test (vs transformers), the sampler bench with the logprobs columns
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 25 python3 -m models.bench.sampler --rows 1,16,64 > $OUT/sampler.md 2>&1; echo "sampler bench rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py -k "log_sum or minus_inf or 8315" -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 170 - ($(date +%s) - T0) )); [ $left -gt 20 ] && { timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_engine_gpu.py -k "logprobs" -rfE > $OUT/engine_tests.log 2>&1; echo "engine logprobs test rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt; }
cat $OUT/times.txt; cat $OUT/sampler.md; tail -3 $OUT/tests.log; tail -3 $OUT/engine_tests.log
