# the same machine, warm, right after call.sh: the 2 ms quiet's burst (c2)
cd /tmp/q2 && PYTHONPATH=/tmp/site:/tmp/q2 python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 3 --workloads burst --out /tmp/sh_c2
