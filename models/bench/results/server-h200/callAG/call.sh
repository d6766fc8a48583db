# issue 25 on the H200: the gathering's quiet 2 ms (HEAD) against 5 ms (= the wait: a pass's worth or 5 ms), both printing gatherings
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
A=scratch/next61/arms
for a in q2 q5; do rm -rf /tmp/$a && mkdir /tmp/$a && cp -r models kernels resplan pyproject.toml /tmp/$a/ && cp $A/engine_core_$a.py /tmp/$a/models/server/engine_core.py; done
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - T0) )); }
run() { # tag arm workload rounds limit extra
  (cd /tmp/$2 && PYTHONPATH=/tmp/site:/tmp/$2 timeout $(( $5 < $(left) ? $5 : $(left) )) python3 -m models.bench.serve_http --model-dir /tmp/q08 $6 --rounds $4 --workloads $3 --out /tmp/sh_$1 > /tmp/sh_$1.log 2>&1)
  echo "$1 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; cp /tmp/sh_$1/results.md $OUT/$1.md 2>/dev/null
}
[ -d /tmp/q08 ] && MK="" || MK="--make qwen3_5-0.8b"
run a5 q5 burst 3 330 "$MK"
[ $(left) -gt 130 ] && run b5p q5 poisson 2 125 ""
[ $(left) -gt 125 ] && run c2 q2 burst 3 125 ""
[ $(left) -gt 125 ] && run d5 q5 burst 3 125 ""
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d sh_* 2>/dev/null) 2>/dev/null
cat $OUT/times.txt; for a in a5 b5p c2 d5; do [ -f $OUT/$a.md ] || continue; echo "== $a"; grep -h -E "^\| (burst|poisson)|^- start" $OUT/$a.md | cut -c1-700; [ -f /tmp/sh_$a/burst-ttft-by-request.csv ] && awk -F, '$2<6{printf "%s:%s %.1f/%.1f  ", $1,$2,$3,$4} END{print ""}' /tmp/sh_$a/burst-ttft-by-request.csv; grep -h GATHER /tmp/sh_$a/server-*.log 2>/dev/null | grep -v "msgs 1 polls 1 tokens [0-9] " | cut -c1-230 | tail -8; done
