#!/bin/bash
# stop 33, device call 4: the bfloat16 GDN state (EngineConfig.state_dtype): the decode graph at 1/16/64 rows with a
# float32 and a bfloat16 state (alternated per batch), greedy tokens of both against transformers, the GPU kernel tests
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
D=$OUT/d9; mkdir -p $D
timeout 170 python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16,64 --state-dtype float32,bfloat16 --top 6 > $D/decode_profile.md 2> $D/decode_profile.err
echo "profile rc=$?"; head -14 $D/decode_profile.md; tail -3 $D/decode_profile.err
timeout 170 python3 models/bench/results/decode-floor-h200/bf16-state/tokens_vs_transformers.py > $D/tokens.txt 2>&1
echo "tokens rc=$?"; tail -4 $D/tokens.txt
timeout 150 python3 -m pytest -m gpu -q -n 4 -p no:benchmark tests/test_gdn_kernel.py tests/test_gdn_prefill.py tests/test_engine_gpu.py -k "not 5000" > $D/gpu_tests.log 2>&1; echo "rc=$?" >> $D/gpu_tests.log
tail -3 $D/gpu_tests.log
