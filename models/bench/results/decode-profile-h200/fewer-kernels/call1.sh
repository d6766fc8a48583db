# session 44, call 1: the one-kernel GDN mixer and the o_proj gate fold compiled, tested and A/B-profiled
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
timeout 230 python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark tests/test_decode_kernels.py tests/test_gemv_gate.py \
  tests/test_gdn_kernel.py tests/test_gemv_silu.py tests/test_gemv_norm.py > $OUT/gpu_kernel_tests.log 2>&1
echo "kernel tests rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|Error" $OUT/gpu_kernel_tests.log | tail -4
D="--paths fused --sampler greedy --attention triton --iters 200 --top 4"
timeout $(left 330) python3 -m models.bench.decode_profile $D --batches 1,16 --mixer one,three --gate fold,split > $OUT/dp_ab_1.md 2>&1
echo "A/B 1 rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) \| fused|Error" $OUT/dp_ab_1.md
timeout $(left 450) python3 -m pytest -m gpu -q -n 4 --dist loadfile -p no:benchmark tests/test_engine_gpu.py -k "triton or fused" > $OUT/gpu_engine_tests.log 2>&1
echo "engine tests rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|Error" $OUT/gpu_engine_tests.log | tail -4
timeout $(left 560) python3 -m models.bench.decode_profile $D --batches 1,16,64 --mixer three,one --gate split,fold > $OUT/dp_ab_2.md 2>&1
echo "A/B 2 rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16|64) \| fused|Error" $OUT/dp_ab_2.md
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
echo "done at $(( $(date +%s) - T0 )) s"
