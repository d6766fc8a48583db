# issue 25: where a burst's first request goes alone. Arms (each with the engine core printing its gathers): q1 (HEAD:
# quiet 1 ms), defer (the idle front end's first intake a turn later), q2 (quiet 2 ms); burst 2 rounds each; poisson (defer)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
A=scratch/s59/arms
for a in q1 defer q2; do rm -rf /tmp/$a && mkdir /tmp/$a && cp -r models kernels resplan pyproject.toml /tmp/$a/; done
cp $A/engine_core_q1.py /tmp/q1/models/server/engine_core.py; cp $A/engine_core_q1.py /tmp/defer/models/server/engine_core.py
cp $A/engine_core_q2.py /tmp/q2/models/server/engine_core.py
for a in q1 q2; do cp $A/turns_head.py /tmp/$a/models/server/turns.py; cp $A/app_head.py /tmp/$a/models/server/app.py; done
grep -c "idle=lambda" /tmp/q1/models/server/app.py /tmp/defer/models/server/app.py /tmp/q2/models/server/app.py >> $OUT/times.txt
run() { # tag dir workload limit extra
  (cd /tmp/$2 && PYTHONPATH=/tmp/site:/tmp/$2 timeout $4 python3 -m models.bench.serve_http --model-dir /tmp/q08 $5 --rounds 2 --workloads $3 --out /tmp/sh_$1 > /tmp/sh_$1.log 2>&1)
  echo "$1 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/sh_$1/results.md $OUT/$1.md 2>/dev/null
}
run q1 q1 burst 300 "--make qwen3_5-0.8b"
run defer defer burst 130 ""
left=$(( 380 - ($(date +%s) - T0) )); [ $left -gt 90 ] && run po defer poisson $left ""
tar czf $OUT/csv.tgz -C /tmp sh_q1 sh_defer sh_q2 sh_po sh_q1.log sh_defer.log sh_q2.log sh_po.log 2>/dev/null
cat $OUT/times.txt; for a in q1 defer q2 po; do echo "== $a"; grep -h -E "^\| (burst|poisson)" $OUT/$a.md | cut -c1-700; [ -f /tmp/sh_$a/burst-ttft-by-request.csv ] && awk -F, '$2<8{printf "%s:%s %.1f/%.1f  ", $1,$2,$3,$4} END{print ""}' /tmp/sh_$a/burst-ttft-by-request.csv; grep -h GATHER /tmp/sh_$a/*.log | grep -v "msgs 1 tokens [0-9] " | cut -c1-110 | tail -8; done
