# call AE, second command (the same H100, warm: /tmp/q08 and the compile caches from call.sh): q2 burst, q2 poisson
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt; ls /tmp/q08 >/dev/null && echo "q08 there" >> $OUT/times.txt
A=scratch/s60/arms; for a in q2; do rm -rf /tmp/$a && mkdir /tmp/$a && cp -r models kernels resplan pyproject.toml /tmp/$a/; cp $A/engine_core_$a.py /tmp/$a/models/server/engine_core.py; done
left() { echo $(( ${TOTAL:-280} - ($(date +%s) - T0) )); }
run() { (cd /tmp/$2 && PYTHONPATH=/tmp/site:/tmp/$2 timeout $(( $4 < $(left) ? $4 : $(left) )) python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 2 --workloads $3 --out /tmp/sh_$1 > /tmp/sh_$1.log 2>&1); echo "$1 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; cp /tmp/sh_$1/results.md $OUT/$1.md 2>/dev/null; }
run d2 q2 burst 110; [ $(left) -gt 100 ] && run po q2 poisson 160
