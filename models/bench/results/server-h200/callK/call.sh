source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 330 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 3 --workloads burst > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? in $(( $(date +%s) - T0 )) s"
cat $OUT/sh/results.md 2>/dev/null | tail -25 || tail -30 $OUT/serve_http.log
rm -f $OUT/sh/*.png $OUT/sh/*.json
left=$(( 540 - ($(date +%s) - T0) ))
echo "switch interval probe with ${left} s"
timeout $left python3 scratch/switch_interval.py $OUT/si > $OUT/si.log 2>&1
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^==|^\| (1|c) " $OUT/si.log | head -40; for f in $OUT/si/*/results.md; do echo "## $f"; grep -E "^\|" $f | head -12; done
find $OUT/si -name "*.png" -delete; find $OUT/si -name "*.json" -delete
save_jit_cache
echo "done at $(( $(date +%s) - T0 )) s"
