# (1) 2B's one-row step with the pre-norm (and silu_mul) fold against without, and the fold's GPU test;
# (2) the host loop, e535205 against HEAD; (3) the 1/16/64-row census, PDL off and on; (4) GPU tests, time allowing
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-480}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
timeout 150 python3 -m scratch.next64.dp_patch --model qwen3_5-2b --paths fused --sampler greedy --attention triton \
  --batches 1 --norm fold,split --silu-mul fold,split --rounds 3 --iters 100 --top 12 > $OUT/fold_2b.md 2>/tmp/f2b.err
echo "fold_2b rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
timeout 100 python3 -m pytest -m gpu -q -p no:benchmark -p no:cacheprovider tests/test_gemv_norm.py -k "fold_equals_without" > /tmp/t_fold.log 2>&1
echo "fold tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
for i in 1 2; do
  for t in scratch/next64/base .; do
    (cd $t && CUDA_VISIBLE_DEVICES= timeout 40 python3 -m models.bench.host_step --concurrency 1,64 --arms resident --rounds 5 2>/dev/null | grep "^| resident" | sed "s|^|$t |") >> $OUT/hs_ab.txt
  done
done
echo "host_step $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); [ $R -gt 200 ] && R=200
[ $R -gt 30 ] && timeout $R python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16,64 \
  --pdl off,on --rounds 2 --iters 100 --top 25 > $OUT/census_triton.md 2>/tmp/c1.err
echo "census rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left)
[ $R -gt 30 ] && timeout $R python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark -p no:cacheprovider tests/test_gemv_norm.py tests/test_engine_gpu.py tests/test_decode_kernels.py > /tmp/gpu_tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cp /tmp/gpu_tests.log /tmp/t_fold.log /tmp/c1.err /tmp/f2b.err $OUT/ 2>/dev/null
cat $OUT/times.txt; grep -E "^\| (1|16|64) " $OUT/fold_2b.md $OUT/census_triton.md; cat $OUT/hs_ab.txt; tail -3 /tmp/t_fold.log; grep -E "passed|failed|error" /tmp/gpu_tests.log | tail -3; grep -E "^(FAILED|ERROR)" /tmp/gpu_tests.log | head
