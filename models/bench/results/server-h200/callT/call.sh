# call T (stop 50): the burst of 256 at 128 running through HTTP, one front end then four, one machine (an H100)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s); i=0
for fe in 1 4; do
  left=$(( 470 - ($(date +%s) - T0) )); [ $left -lt 120 ] && break; i=$((i+1))
  mk=""; [ $i -eq 1 ] && mk="--make qwen3_5-0.8b"
  timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 $mk --rounds 1 --workloads burst --max-running 128 --num-requests 256 --front-ends $fe --out $OUT/r$i-fe$fe > $OUT/r$i-fe$fe.log 2>&1
  echo "r$i fe=$fe rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| burst|ready in" $OUT/r$i-fe$fe/results.md | cut -c1-600
done
find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete
