# the same machine, warm, right after call.sh: the burst again (3 rounds), then decode_profile at 1, 16 and 64 rows
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
timeout 200 python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 3 --workloads burst --out /tmp/sh2 > /tmp/sh2.log 2>&1
python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16,64 --rounds 2 --iters 200 --top 12 > $OUT/dp.md 2>&1
