# issue 25 at 21b8a3b: gathering quiet 1 ms (HEAD) against 2 ms, both printing their gathers; burst 2 rounds each,
# alternated q1 q2 q1 q2 [poisson q2] q1 q2 while time is left
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
A=scratch/s60/arms
for a in q1 q2; do rm -rf /tmp/$a && mkdir /tmp/$a && cp -r models kernels resplan pyproject.toml /tmp/$a/; done
for a in q1 q2; do cp $A/engine_core_$a.py /tmp/$a/models/server/engine_core.py; done
grep -c "BURST_QUIET_MS = 2\|GATHER" /tmp/q1/models/server/engine_core.py /tmp/q2/models/server/engine_core.py >> $OUT/times.txt
run() { # tag dir workload limit extra
  (cd /tmp/$2 && PYTHONPATH=/tmp/site:/tmp/$2 timeout $(( $4 < $(left) ? $4 : $(left) )) python3 -m models.bench.serve_http --model-dir /tmp/q08 $5 --rounds 2 --workloads $3 --out /tmp/sh_$1 > /tmp/sh_$1.log 2>&1)
  echo "$1 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/sh_$1/results.md $OUT/$1.md 2>/dev/null
}
left() { echo $(( ${TOTAL:-575} - ($(date +%s) - T0) )); }
run a1 q1 burst 300 "--make qwen3_5-0.8b"
[ $(left) -gt 90 ] && run b2 q2 burst 130 ""
[ $(left) -gt 90 ] && run c1 q1 burst 130 ""
[ $(left) -gt 90 ] && run d2 q2 burst 130 ""
[ $(left) -gt 120 ] && run po q2 poisson 150 ""
[ $(left) -gt 90 ] && run e1 q1 burst 130 ""
[ $(left) -gt 90 ] && run f2 q2 burst 130 ""
tar czf $OUT/logs.tgz -C /tmp sh_a1 sh_b2 sh_po sh_c1 sh_d2 sh_e1 sh_f2 sh_a1.log sh_b2.log sh_po.log sh_c1.log sh_d2.log sh_e1.log sh_f2.log 2>/dev/null
cat $OUT/times.txt; for a in a1 b2 po c1 d2 e1 f2; do echo "== $a"; grep -h -E "^\| (burst|poisson)|^- start|first request" $OUT/$a.md 2>/dev/null | cut -c1-600; [ -f /tmp/sh_$a/burst-ttft-by-request.csv ] && awk -F, '$2<8{printf "%s:%s %.1f/%.1f  ", $1,$2,$3,$4} END{print ""}' /tmp/sh_$a/burst-ttft-by-request.csv; grep -h GATHER /tmp/sh_$a/*.log 2>/dev/null | grep -v "msgs 1 tokens [0-9] " | cut -c1-160 | tail -6; done
