# call AE, third command (the same H100, warm): one more q2 burst run
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
(cd /tmp/q2 && PYTHONPATH=/tmp/site:/tmp/q2 timeout 125 python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 2 --workloads burst --out /tmp/sh_e2 > /tmp/sh_e2.log 2>&1)
