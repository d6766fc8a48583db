# serve's steady-step host column at c=1 and c=64 (resident-triton, host-triton-overlap)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
timeout ${BUDGET:-170} python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,64 \
  --arms host-triton-overlap,resident-triton --rounds 1 --out /tmp/serve > /tmp/serve.log 2>&1
echo "serve rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cp /tmp/serve/results.md $OUT/serve.md 2>/dev/null; tail -c 1500 /tmp/serve.log > $OUT/serve_tail.log
cat $OUT/times.txt; grep -E "^\| " $OUT/serve.md | cut -c1-460 | head -8; tail -c 600 /tmp/serve.log
