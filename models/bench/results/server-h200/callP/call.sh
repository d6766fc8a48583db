# call 5 (session 43): a kernel boundary's cost in a graph; the one-row step's kernels, all of them; the burst through HTTP from 8 client processes
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 90 python3 scratch/chain_probe.py > $OUT/chain_probe.log 2>&1; echo "probe rc=$?"; cat $OUT/chain_probe.log | tail -12
timeout 120 python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1 --top 40 > $OUT/census_b1.md 2>&1
echo "census rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| " $OUT/census_b1.md | tail -42
left=$(( 600 - 20 - ($(date +%s) - T0) )); echo "serve_http with $left s"
timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh8 --rounds 3 --workloads burst --client-procs 8 > $OUT/serve_http8.log 2>&1
echo "serve_http rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^- |^\| " $OUT/sh8/results.md 2>/dev/null | cut -c1-900 || tail -5 $OUT/serve_http8.log
grep -h "send lag\|^| http" $OUT/sh8/burst-http-round*.log 2>/dev/null | cut -c1-400 | head -8
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; rm -rf $OUT/sh8/*-http $OUT/sh8/*-engine $OUT/sh8/server-*.log
echo "done at $(( $(date +%s) - T0 )) s"
