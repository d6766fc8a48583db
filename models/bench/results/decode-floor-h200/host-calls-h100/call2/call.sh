# where the resident step's host time goes on a GPU host: phases (c=1, c=64), the stubbed loop, a py-spy profile
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-560}; left() { echo $(( B - ($(date +%s) - T0) )); }
SPY=/tmp/site/py_spy-0.4.3.data/scripts/py-spy; chmod +x $SPY
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
timeout 150 python3 -m scratch.next66.phases --c 1 --gen 1024 --rounds 3 > $OUT/phases_c1.md 2>/tmp/p1.err
echo "phases c1 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); [ $R -gt 100 ] && R=100
[ $R -gt 30 ] && timeout $R $SPY record -r 250 -f raw -o /tmp/spy_c1.raw -- \
  python3 -m scratch.next66.phases --c 1 --gen 1024 --rounds 2 --wrap off > /tmp/spy.out 2>/tmp/spy.err
echo "spy rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
python3 scratch/next66/agg.py /tmp/spy_c1.raw 70 > $OUT/spy_c1_agg.txt 2>&1; gzip -c /tmp/spy_c1.raw > $OUT/spy_c1.raw.gz
R=$(left); [ $R -gt 100 ] && R=100
true
echo "phases c64 rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left); [ $R -gt 60 ] && R=60
[ $R -gt 20 ] && true
  
echo "host_step rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
if echo "$name" | grep -q H200; then
R=$(left); [ $R -gt 130 ] && R=130
[ $R -gt 40 ] && timeout $R python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton \
  --batches 1,16,64 --rounds 2 --iters 100 --top 12 > $OUT/dp_08b.md 2>/tmp/dp1.err
echo "dp rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
R=$(left)
[ $R -gt 40 ] && timeout $R python3 -m models.bench.decode_profile --model qwen3_5-2b --paths fused --sampler greedy \
  --attention triton --batches 1 --rounds 2 --iters 100 --top 6 > $OUT/dp_2b.md 2>/tmp/dp3.err
echo "dp 2b rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
grep -E "^\| (1|16|64) " $OUT/dp_*.md
fi
tail -c 1500 /tmp/p1.err > $OUT/err.txt; tail -c 1000 /tmp/spy.err >> $OUT/err.txt; tail -c 800 /tmp/p2.err >> $OUT/err.txt
cat /tmp/spy.out >> $OUT/phases_c1.md
cat $OUT/times.txt $OUT/phases_c1.md; grep -E "^##|driver._step|_decode_l|_prepare|table.emit" $OUT/phases_c64.md
cat $OUT/host_step.md; head -75 $OUT/spy_c1_agg.txt; ls -la $OUT; tail -5 $OUT/err.txt
