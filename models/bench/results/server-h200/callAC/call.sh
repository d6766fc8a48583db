# issue 25: serve_http burst, --burst-wait-ms 0 against 5 alternated on one machine (2 rounds each run)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(git log --oneline -1 2>/dev/null)" > $OUT/times.txt
run() { # tag wait limit extra
  timeout $3 python3 -m models.bench.serve_http --model-dir /tmp/q08 $4 --rounds 2 --workloads burst --burst-wait-ms $2 --out /tmp/sh_$1 > /tmp/sh_$1.log 2>&1
  echo "$1 (wait $2) rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/sh_$1/results.md $OUT/$1.md 2>/dev/null; cp /tmp/sh_$1/burst-ttft-by-request.csv $OUT/$1.csv 2>/dev/null
}
run a0 0 300 "--make qwen3_5-0.8b"
for t in b5 c0 d5; do left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 120 ] || break; run $t ${t:1} $left ""; done
tar czf $OUT/rest.tgz -C /tmp sh_a0 sh_b5 sh_c0 sh_d5 sh_a0.log sh_b5.log sh_c0.log sh_d5.log 2>/dev/null
cat $OUT/times.txt; for a in a0 b5 c0 d5; do echo "== $a"; grep -h -E "^\| burst" $OUT/$a.md | cut -c1-900; awk -F, '$2<4{printf "%s:%s %s/%s  ", $1,$2,$3,$4} END{print ""}' $OUT/$a.csv; done
