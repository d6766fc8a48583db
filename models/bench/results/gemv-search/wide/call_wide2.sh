# call 2: decode_profile at 32 and 64 rows, the wide configs (this tree) against cuBLAS there (scratch/base = 7330c32),
# alternated; the kernels' and the engine's GPU tests; the front end over a stand-in engine (issue 25).
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
run() { timeout 150 python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 16,32,64 --top 8 "$@"; }
for i in 1 2; do
  run > $OUT/new_$i.md 2>&1
  (cd scratch/base && run > $OUT/base_$i.md 2>&1)
done
echo "ab done in $(( $(date +%s) - T0 )) s"
grep -h "^| [0-9]" $OUT/new_*.md $OUT/base_*.md
T1=$(date +%s)
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:benchmark -n 4 tests/test_decode_kernels.py tests/test_gemv_silu.py tests/test_engine_gpu.py -k "not 5000" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? in $(( $(date +%s) - T1 )) s"; tail -3 $OUT/gpu_tests.log
fe() { name=$1; shift; timeout 100 python3 -m models.bench.front_end --out $OUT/fe/$name --rounds 2 "$@" > $OUT/fe_$name.log 2>&1;
  echo "== $name $*"; tail -4 $OUT/fe/$name/results.md 2>/dev/null || tail -20 $OUT/fe_$name.log; }
fe slow4 --step-ms 1.78 --slow-every 3 --slow-ms 5 --client-procs 4
fe flat4 --step-ms 1.78 --client-procs 4
echo "all in $(( $(date +%s) - T0 )) s"
