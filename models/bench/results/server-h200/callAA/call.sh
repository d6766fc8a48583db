# issue 25: burst through HTTP, 3 paired rounds, with the fixed cost split (headers, server TTFT, passes); poisson if time is left
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
timeout 420 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 3 --workloads burst --out /tmp/sh > $OUT/serve_http.log 2>&1
echo "serve_http burst rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
left=$(( 560 - ($(date +%s) - T0) ))
if [ $left -gt 150 ]; then timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --rounds 2 --workloads poisson --out /tmp/po > $OUT/serve_http_po.log 2>&1; echo "serve_http poisson rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; fi
cp /tmp/sh/results.md $OUT/sh_results.md 2>/dev/null; cp /tmp/sh/*.csv $OUT/ 2>/dev/null; cp /tmp/po/results.md $OUT/po_results.md 2>/dev/null; tar czf $OUT/rest.tgz -C /tmp sh po 2>/dev/null
cat $OUT/times.txt; grep -E "^- start|^\| (burst|poisson)|^\| workload" /tmp/sh/results.md /tmp/po/results.md | cut -c1-2500; tail -3 $OUT/serve_http.log
