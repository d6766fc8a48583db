# call R (stop 48): the burst through HTTP twice on one warm machine, one tree (bce9c02), right after the GPU suite
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
for r in a b; do
  timeout 270 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --rounds 2 --workloads burst --out $OUT/$r > $OUT/$r.log 2>&1
  echo "$r rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| burst" $OUT/$r/results.md
done
find $OUT -name "*.json" -delete
