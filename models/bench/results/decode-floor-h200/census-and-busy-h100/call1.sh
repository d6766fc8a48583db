# stop 68 call 1: the decode step's census on this card (0.8B 1/16/64 PDL off/on, 2B 1 row), then every arm on a busy host
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-560}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus $(git log --oneline -1 | cut -c1-8)" > $OUT/times.txt
timeout 200 python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16,64 \
  --pdl off,on --rounds 2 --iters 100 --top 30 > $OUT/census_08b.md 2> /tmp/c08.err
echo "census 0.8B rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; tail -2 /tmp/c08.err >> $OUT/times.txt
timeout 120 python3 -m models.bench.decode_profile --model qwen3_5-2b --paths fused --sampler greedy --attention triton \
  --batches 1 --rounds 2 --iters 100 --top 30 > $OUT/dp_2b.md 2> /tmp/c2b.err
echo "2B rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; tail -2 /tmp/c2b.err >> $OUT/times.txt
L=$(left)
timeout $(( L - 10 )) python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1 \
  --arms host,host-overlap,host-triton-overlap,resident-fa2,resident-xqa,resident-triton --host-load 0,0.3,0.6 \
  --rounds 2 --out $OUT/busy > /tmp/busy.log 2>&1
echo "serve rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; tail -3 /tmp/busy.log >> $OUT/times.txt
cat $OUT/times.txt; grep -E "^\| (1|16|64) " $OUT/census_08b.md $OUT/dp_2b.md | cut -c1-200
grep -E "^\| qwen" $OUT/busy/results.md 2>/dev/null | awk -F'|' '{print $2"|"$3"|"$4"|"$7"|"$10"|"$16"|"$19"|"$20"|"$23"|"$24}'
