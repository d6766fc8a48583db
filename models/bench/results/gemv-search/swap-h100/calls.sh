# call 1 on an H100: the GEMV tests compiled (SWAP included), the SWAP sweep (16, 64 rows), decode_profile base / swap picks / pps8
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/times.txt 2>&1
timeout 90 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -x tests/test_decode_kernels.py -k "gemv" > $OUT/gemv_tests.log 2>&1; echo "tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 250 python3 -m scratch.swap.sweep $OUT/picks.json > $OUT/sweep.md 2> $OUT/sweep.err; echo "sweep rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
[ -f $OUT/picks.json ] || echo '{}' > $OUT/picks.json
for v in base swap=$OUT/picks.json pps8 swap=$OUT/picks.json base pps8; do
  left=$(( 575 - ($(date +%s) - T0) )); [ $left -lt 45 ] && break
  echo "=== dp $v" >> $OUT/dp.md
  timeout $left python3 -m scratch.swap.dp $v --paths fused --sampler greedy --attention triton --batches 16,64 --rounds 2 --iters 100 --top 0 >> $OUT/dp.md 2>&1
  echo "dp $v rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
done
cat $OUT/times.txt; tail -3 $OUT/gemv_tests.log; grep -v "^<!--" $OUT/sweep.md; tail -5 $OUT/sweep.err; grep -h "^| 16\|^| 64\|=== dp" $OUT/dp.md
# call 4: GPU tests (argmax, gemv with the SWAP table, the engine's tokens), the embedding/argmax microbench, decode_profile old vs new
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 40 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_argmax.py > $OUT/tests.log 2>&1; echo "argmax tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m scratch.emb > $OUT/emb.md 2>&1; echo "emb rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 250 python3 -m pytest -q -m gpu -n 6 --dist loadfile -p no:benchmark -p no:cacheprovider tests/test_decode_kernels.py tests/test_engine_gpu.py tests/test_graph_gpu.py -x -rfE >> $OUT/tests.log 2>&1; echo "gpu tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
for v in base whole=scratch/old_table.json base whole=scratch/old_table.json; do
  left=$(( 575 - ($(date +%s) - T0) )); [ $left -lt 45 ] && break
  a=triton,torch; [ $v = base ] || a=torch
  echo "=== dp $v --argmax $a" >> $OUT/dp.md
  timeout $left python3 -m scratch.swap.dp $v --paths fused --sampler greedy --attention triton --batches 1,16,64 --rounds 2 --iters 100 --top 0 --argmax $a >> $OUT/dp.md 2>&1
  echo "dp $v rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
done
cat $OUT/times.txt $OUT/emb.md; tail -4 $OUT/tests.log; grep -h "^| 1 \|^| 16\|^| 64\|=== dp" $OUT/dp.md
