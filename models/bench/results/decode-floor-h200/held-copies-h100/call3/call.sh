# stop 67 call 3: serve A/B at c=64 against ef9dd13 (held copies), the split-16 search of the N = 1024 GEMMs at 16-64 rows
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-440}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
timeout 230 python3 -m models.bench.gemv --model qwen3_5-0.8b --rows 16,64 --parts gemv --shapes 1024x3584,1024x2048 \
  --jobs 16 > $OUT/gemv_split16.md 2> /tmp/gemv.err
echo "gemv rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; tail -3 /tmp/gemv.err >> $OUT/times.txt
for r in 1 2; do for tree in new base; do
  L=$(left); [ $L -lt 50 ] && break 2
  if [ $tree = base ]; then D=$PWD/scratch/next67/base; else D=$PWD; fi  # (-m imports from the working directory)
  (cd $D && PYTHONPATH=/tmp/site:$D timeout $(( L - 5 )) python3 -m models.bench.serve --model qwen3_5-0.8b \
    --concurrency 64 --arms host-triton-overlap,resident-triton --host-load 0,0.6 --rounds 1 --out /tmp/s_${tree}$r \
    > /tmp/s_${tree}$r.log 2>&1)
  echo "serve $tree $r rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/s_${tree}$r/results.md $OUT/serve64_${tree}$r.md 2>/dev/null || tail -5 /tmp/s_${tree}$r.log
done; done
cat $OUT/times.txt; grep -v "^<\!--" $OUT/gemv_split16.md | head -40
for f in $OUT/serve64_*.md; do echo "== $f"; grep -E "^\| qwen" $f | awk -F'|' '{print $2"|"$3"|"$4"|"$7"|"$10"|"$16"|"$19"|"$20"|"$23"|"$24}'; done
