# whichever machine comes: an H200 runs issue 25's burst + Poisson through HTTP (3 paired rounds); an H100 runs the
# GPU tests no GPU has run (a594d37's buckets, the eager-pass tuning test, the prefix cache on the GPU) and the gemv bench
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(git log --oneline -1 | cut -c1-8)" > $OUT/times.txt
case "$name" in
*H200*)
  timeout 420 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads burst --out $OUT/sh > $OUT/serve_http.log 2>&1
  echo "serve_http rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete; find $OUT -name "*.png" -delete; rm -rf $OUT/sh/*http-round*
  cat $OUT/times.txt; grep -E "^- start|^\| (burst|poisson)" $OUT/sh/results.md | cut -c1-700; tail -3 $OUT/serve_http.log;;
*)
  timeout 330 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu -n 4 --dist loadfile tests/test_prefill_graphs.py tests/test_prefix_cache_gpu.py tests/test_engine_gpu.py -rfE > $OUT/gpu_tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  timeout 150 python3 -m models.bench.gemv --model qwen3_5-0.8b --rows 1,16 --quick --jobs 16 > $OUT/gemv.md 2>&1; echo "gemv rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cat $OUT/times.txt; tail -4 $OUT/gpu_tests.log; grep "^| " $OUT/gemv.md | head -16;;
esac
