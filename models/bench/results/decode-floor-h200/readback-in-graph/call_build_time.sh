source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
mkdir -p /tmp/base && tar -xzf scratch/base.tar.gz -C /tmp/base && cp -r scratch /tmp/base/
timeout 200 python3 -m pytest -m gpu -q -p no:benchmark tests/test_engine_gpu.py tests/test_traffic_gpu.py -k "logprobs or first_tokens or host_twins" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_tests.log
timeout 100 python3 scratch/build_time.py warm-up-new 2>&1 | tail -1
for r in 1 2; do
  timeout 60 python3 scratch/build_time.py new 2>&1 | tail -1
  (cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base timeout 60 python3 scratch/build_time.py base 2>&1 | tail -1)
done
echo "done at $(( $(date +%s) - T0 )) s"
