# stop 55, call 1 (H100): the sampled step's in-step kernels at 1 and 64 rows; the sampler bench's logits kinds; the GPU tests of the sampled and logprobs paths on 0f6c291
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 150 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py -x -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m models.bench.sampler --rows 1,16,64 --logits normal,clustered,tied > $OUT/sampler.md 2>&1; echo "sampler bench rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 120 python3 -m models.bench.decode_profile --paths fused --sampler full,greedy --attention triton --batches 1,64 --rounds 2 --iters 50 --top 14 > $OUT/dp.md 2>&1; echo "dp rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 570 - ($(date +%s) - T0) )); [ $left -gt 30 ] && { timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_engine_gpu.py -k "sampl or logprobs" -rfE > $OUT/engine_tests.log 2>&1; echo "engine tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt; }
cat $OUT/times.txt; tail -3 $OUT/tests.log; cat $OUT/sampler.md; grep -h "^| 1 \|^| 64\|sample\|argmax\|Error" $OUT/dp.md | head -60; tail -3 $OUT/engine_tests.log
