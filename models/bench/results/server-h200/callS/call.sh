# call S (stop 49): the burst through HTTP with 1 and 4 front-end processes, alternated, one machine
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
i=0
for fe in 1 4 1 4 1 4; do
  left=$(( 570 - ($(date +%s) - T0) ))
  [ $left -lt 170 ] && break
  i=$((i+1))
  mk=""; [ $i -eq 1 ] && mk="--make qwen3_5-0.8b"
  timeout $left python3 -m models.bench.serve_http --model-dir /tmp/q08 $mk --rounds 2 --workloads burst --front-ends $fe --out $OUT/r$i-fe$fe > $OUT/r$i-fe$fe.log 2>&1
  echo "r$i fe=$fe rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| burst|ready in" $OUT/r$i-fe$fe/results.md | cut -c1-400
done
find $OUT -name "*.json" -delete; find $OUT -name "*round*.log" -delete
