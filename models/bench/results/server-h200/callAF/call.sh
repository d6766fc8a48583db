# issue 25 acceptance at HEAD (burst wait 5 ms, 2 ms quiet, idle front end turn): burst 3 rounds, poisson 2 if time
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
timeout 360 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads burst --out /tmp/sh > /tmp/sh.log 2>&1
echo "burst rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
left=$(( 570 - ($(date +%s) - T0) )); [ $left -gt 100 ] && { timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 2 --workloads poisson --out /tmp/po > /tmp/po.log 2>&1; echo "poisson rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; }
cp /tmp/sh/results.md $OUT/burst.md; cp /tmp/po/results.md $OUT/poisson.md 2>/dev/null; tar czf $OUT/rest.tgz -C /tmp sh po sh.log po.log 2>/dev/null
cat $OUT/times.txt; grep -h -E "^\| (burst|poisson)|^- start" $OUT/burst.md $OUT/poisson.md | cut -c1-900
