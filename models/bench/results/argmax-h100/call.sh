# call 1: argmax v2 on the GPU (tests, microbench, step A/B); on an H200 also the SWAP table against the one before it
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card" > $OUT/times.txt
timeout 60 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_argmax.py > $OUT/tests.log 2>&1; echo "argmax tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m scratch.emb > $OUT/emb.md 2>&1; echo "emb rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 150 python3 -m pytest -q -m gpu -n 6 --dist loadfile -p no:benchmark -p no:cacheprovider tests/test_decode_kernels.py tests/test_engine_gpu.py -x -rfE >> $OUT/tests.log 2>&1; echo "gpu tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
case "$card" in *H200*) vs="base whole=scratch/old_table.json base whole=scratch/old_table.json";; *) vs="base base";; esac
for v in $vs; do
  left=$(( 570 - ($(date +%s) - T0) )); [ $left -lt 45 ] && break
  a=torch,triton; [ $v = base ] || a=torch
  echo "=== dp $v --argmax $a" >> $OUT/dp.md
  timeout $left python3 -m scratch.swap.dp $v --paths fused --sampler greedy --attention triton --batches 1,16,64 --rounds 2 --iters 100 --top 0 --argmax $a >> $OUT/dp.md 2>&1
  echo "dp $v rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
done
cat $OUT/times.txt $OUT/emb.md; tail -4 $OUT/tests.log; grep -h "^| 1 \|^| 16\|^| 64\|=== dp\|copy moves" $OUT/dp.md
