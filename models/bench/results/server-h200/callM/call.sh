source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 420 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 2 --workloads poisson,burst > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^- start|^\| (poisson|burst)" $OUT/sh/results.md 2>/dev/null | cut -c1-900 || tail -5 $OUT/serve_http.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; rm -rf $OUT/sh/*-http $OUT/sh/*-engine
for r in 1 2; do left=$(( 580 - ($(date +%s) - T0) )); [ $left -gt 30 ] || break
  timeout $left python3 scratch/startup_probe.py /tmp/q08 time > $OUT/start_warm$r.log 2>&1; echo "start warm $r rc=$? at $(( $(date +%s) - T0 )) s"; grep "^\[" $OUT/start_warm$r.log | tr '\n' ' '; echo; done
