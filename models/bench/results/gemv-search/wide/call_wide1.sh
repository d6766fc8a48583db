# call 1 of the wide-row weight stream: the search at 32 and 64 rows (0.8B), the kernels' GPU tests, the 2B search.
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
timeout 330 python3 -m models.bench.gemv --model qwen3_5-0.8b --rows 32,64 > $OUT/gemv_wide_08b.md 2> $OUT/gemv_wide_08b.err
echo "search rc=$? in $(( $(date +%s) - T0 )) s"
grep -v "^<!--" $OUT/gemv_wide_08b.md | head -40
T1=$(date +%s)
timeout 120 python3 -m pytest -m gpu -q -x -p no:cacheprovider -p no:benchmark -n 4 tests/test_decode_kernels.py -k gemv tests/test_gemv_silu.py > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? in $(( $(date +%s) - T1 )) s"; tail -3 $OUT/gpu_tests.log
left=$(( 570 - ($(date +%s) - T0) ))
echo "2B search with ${left} s"
timeout $left python3 -m models.bench.gemv --model qwen3_5-2b --rows 32,64 --quick > $OUT/gemv_wide_2b_quick.md 2> $OUT/gemv_wide_2b.err
echo "2B rc=$?"; grep -v "^<!--" $OUT/gemv_wide_2b_quick.md | head -30
