# stop 55, call 2: where the engine's host goes, sampled by py-spy (no tracing overhead): the in-process burst at 32
# running (serve_http's in-process arm) and the c=1 / c=64 decode loops (serve's resident-triton)
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
SPY=/tmp/site/py_spy-0.4.3.data/scripts/py-spy; chmod +x $SPY
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt; nproc >> $OUT/times.txt
B="python3 -m models.bench.traffic --num-requests 128 --rate inf --rounds 1 --no-progress --model qwen3_5-0.8b --arms resident-triton-cache --max-running 32 --max-seq-len 2048"
timeout 200 $B --seed 0 --out /tmp/b0 > $OUT/burst_plain0.log 2>&1; echo "burst plain rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
timeout 200 $SPY record -r 400 -f raw -o /tmp/burst.raw -- $B --seed 0 --out /tmp/b1 > $OUT/burst_spy.log 2>&1; echo "burst spy rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
python3 scratch/p55/agg.py  # (agg.py.txt here) /tmp/burst.raw 90 > $OUT/burst_agg.txt 2>&1
S="python3 -m models.bench.serve --model qwen3_5-0.8b --prompt-len 512 --gen 256 --rounds 1 --arms resident-triton"
timeout 200 $SPY record -r 400 -f raw -o /tmp/c1.raw -- $S --concurrency 1 --out /tmp/s1 > $OUT/serve_c1_spy.log 2>&1; echo "c1 spy rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
python3 scratch/p55/agg.py  # (agg.py.txt here) /tmp/c1.raw 90 > $OUT/c1_agg.txt 2>&1
left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 60 ] && { timeout $left $SPY record -r 400 -f raw -o /tmp/c64.raw -- $S --concurrency 64 --out /tmp/s64 > $OUT/serve_c64_spy.log 2>&1; echo "c64 spy rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt; python3 scratch/p55/agg.py  # (agg.py.txt here) /tmp/c64.raw 90 > $OUT/c64_agg.txt 2>&1; }
grep -h "^| " /tmp/b0/results.md /tmp/b1/results.md 2>/dev/null | head -6 > $OUT/burst_tables.md
cp /tmp/s1/results.md $OUT/serve_c1.md 2>/dev/null; cp /tmp/s64/results.md $OUT/serve_c64.md 2>/dev/null
cat $OUT/times.txt; head -45 $OUT/burst_agg.txt; head -30 $OUT/c1_agg.txt
