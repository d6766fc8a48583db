# call 3 (same machine): the resident engine's host time a decode step on the GPU host, this tree against 0c0a456, alternated
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s); R=$(pwd)
for t in new base new base; do
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -lt 60 ] && break
  d=$R; [ $t = base ] && d=$R/scratch/base
  o=/tmp/serve_${t}_$(date +%s); echo "=== serve $t" >> $OUT/serve.md
  (cd $d && PYTHONPATH=$R:$PYTHONPATH timeout $left python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,64 --prompt-len 512 --gen 256 --rounds 2 --arms resident-triton,host-triton-overlap --out $o > $o.log 2>&1); echo "serve $t rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
  cat $o/results.md >> $OUT/serve.md 2>/dev/null || tail -20 $o.log >> $OUT/serve.md
done
cat $OUT/serve.md | grep -v "^$" | head -150
