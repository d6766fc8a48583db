# call 1 (session 43): de227a5 on the GPU (tests, attention at wide tables, old vs new kernel), the 0.8B GEMV search on the H200
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 tests/test_paged_decode.py tests/test_engine_gpu.py -k "paged or triton" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? in $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_tests.log
A="--ctx 640 --batches 1,16,64 --iters 100"
for r in 1 2; do
  for tc in 640 262144; do
    timeout 60 python3 -m models.bench.attention $A --table-ctx $tc --backends xqa,triton > $OUT/att_new_${tc}_$r.md 2>&1
    (cd scratch/oldtree && timeout 60 python3 -m models.bench.attention $A --table-ctx $tc --backends triton) > $OUT/att_old_${tc}_$r.md 2>&1
  done
done
echo "attention at $(( $(date +%s) - T0 )) s"
for f in $OUT/att_*; do echo "## $f"; grep -E "^\| *[0-9]" $f | head -8; done
T1=$(date +%s)
timeout 300 python3 -m models.bench.gemv --model qwen3_5-0.8b --rows 1,16 > $OUT/gemv_h200_08b.md 2> $OUT/gemv.err
echo "search rc=$? in $(( $(date +%s) - T1 )) s"; grep -v "^<!--" $OUT/gemv_h200_08b.md | head -60; tail -3 $OUT/gemv.err
for r in 1 2; do left=$(( 570 - ($(date +%s) - T0) )); [ $left -gt 60 ] || break
  timeout $(( left / 2 )) python3 scratch/dp_cfg.py $OUT/gemv_h200_08b.md -- --paths fused --sampler greedy --attention triton --batches 1,16 --top 3 > $OUT/dp_new_$r.md 2>&1
  timeout $(( left / 2 )) python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16 --top 3 > $OUT/dp_old_$r.md 2>&1
  grep -E "dp_cfg|^\| (1|16) \| fused" $OUT/dp_new_$r.md $OUT/dp_old_$r.md | cut -c1-300
done
echo "done at $(( $(date +%s) - T0 )) s"
