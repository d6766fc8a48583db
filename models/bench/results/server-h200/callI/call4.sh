# stop 36 call 4: the GPU tests of the state and pass changes; the burst in-process, e0dca07 (base) against this tree,
# on an idle host and beside six busy processes, alternated
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 150 python3 -m pytest -m gpu -q -n 4 --dist loadfile -p no:cacheprovider -p no:benchmark tests/test_prefix_cache_gpu.py tests/test_prefill_graphs.py tests/test_gdn_prefill.py tests/test_prefill_kernels_gpu.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - T0 )) s"; tail -2 $OUT/gpu_tests.log
TR="-m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate inf --rounds 2 --arms resident-triton-cache --max-running 32 --max-seq-len 2048"
burn() { for i in $(seq 1 6); do python3 -c "while True: pass" & done; sleep 1; }
run() {  # tree label busy
  left=$(( 585 - ($(date +%s) - T0) )); [ $left -lt 30 ] && { echo "skip $2 (time)"; return; }
  [ "$3" = busy ] && burn
  if [ "$1" = base ]; then (cd scratch/base && timeout $left python3 $TR --out $OUT/$2 > $OUT/$2.log 2>&1); else timeout $left python3 $TR --out $OUT/$2 > $OUT/$2.log 2>&1; fi
  echo "$2 rc=$? at $(( $(date +%s) - T0 )) s"
  [ "$3" = busy ] && { pkill -f "while True: pass"; sleep 1; }
  rm -f $OUT/$2/*.png
}
run head head_idle_0 idle; run base base_idle_1 idle; run head head_busy_2 busy; run base base_busy_3 busy
run head head_idle_4 idle; run base base_idle_5 idle
for x in head_idle_0 base_idle_1 head_busy_2 base_busy_3 head_idle_4 base_idle_5; do echo "== $x"; grep "^| resident" $OUT/$x/results.md 2>/dev/null | cut -d'|' -f6,11,14,17,18,19,20,24,25,26; done
