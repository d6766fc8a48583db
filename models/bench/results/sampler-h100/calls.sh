# call 2: the sampler's cost piece by piece; the step with the full sampler; GPU tests with the argmax kernel on by default
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 120 python3 -m scratch.samp.bench > $OUT/samp.md 2>&1; echo "samp rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 100 python3 -m models.bench.decode_profile --paths fused --sampler full --attention triton --batches 1,16,64 --rounds 1 --iters 100 --top 0 > $OUT/dp_full.md 2>&1; echo "dp full rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 320 python3 -m pytest -q -m gpu -n 8 --dist loadfile -p no:benchmark -p no:cacheprovider tests/test_engine_gpu.py tests/test_argmax.py tests/test_decode_kernels.py tests/test_graph_gpu.py -rfE --durations=5 > $OUT/tests.log 2>&1; echo "gpu tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
cat $OUT/times.txt $OUT/samp.md; grep -h "^| 1 \|^| 16\|^| 64\|copy moves" $OUT/dp_full.md; tail -12 $OUT/tests.log
# call 3: kernels.sample compiled (tests), its block/warps sweep, the sampler bench, the decode step sampled both ways, engine tests
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 150 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py tests/test_argmax.py -x -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 120 python3 -m scratch.samp.sweep > $OUT/sweep.md 2>&1; echo "sweep rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m models.bench.sampler --rows 1,4,16,64 > $OUT/sampler.md 2>&1; echo "sampler bench rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 150 python3 -m models.bench.decode_profile --paths fused --sampler full,full-torch,greedy --attention triton --batches 1,16,64 --rounds 2 --iters 100 --top 0 > $OUT/dp.md 2>&1; echo "dp rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 560 - ($(date +%s) - T0) ))
timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" -n 6 --dist loadfile tests/test_engine_gpu.py tests/test_engine.py -k "sampl or Sampl or greedy" -rfE > $OUT/engine_tests.log 2>&1; echo "engine tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
cat $OUT/times.txt; tail -15 $OUT/tests.log; cat $OUT/sweep.md $OUT/sampler.md; grep -h "^| 1 \|^| 16\|^| 64\|copy moves\|Error" $OUT/dp.md; tail -8 $OUT/engine_tests.log
