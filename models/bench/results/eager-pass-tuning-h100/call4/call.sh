# stop 55, call 4: e30ec86 (eager passes' tuning at build) on the GPU: the prefill tests compiled, and serve c=64 (whole
# prompts: a 32768-token eager pass) under py-spy on a machine's first run, the autotuner's samples in build vs steps
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
SPY=/tmp/site/py_spy-0.4.3.data/scripts/py-spy; chmod +x $SPY
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
S="python3 -m models.bench.serve --model qwen3_5-0.8b --prompt-len 512 --gen 256 --rounds 1 --arms resident-triton"
timeout 300 $SPY record -r 200 -f raw -o /tmp/c64.raw -- $S --concurrency 64 --out /tmp/s64 > $OUT/serve_c64_spy.log 2>&1; echo "c64 spy rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
python3 scratch/p55/tunecount.py /tmp/c64.raw > $OUT/tunecount.txt 2>&1; python3 scratch/p55/agg.py /tmp/c64.raw 40 > $OUT/c64_agg.txt 2>&1
cp /tmp/s64/results.md $OUT/serve_c64.md 2>/dev/null
left=$(( 540 - ($(date +%s) - T0) )); timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_prefill_graphs.py tests/test_conv1d_varlen.py tests/test_prefill_kernels_gpu.py -rfE > $OUT/gpu_tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cat $OUT/times.txt $OUT/tunecount.txt; head -25 $OUT/c64_agg.txt; tail -3 $OUT/gpu_tests.log; grep "c=64" $OUT/serve_c64.md | cut -c1-400
