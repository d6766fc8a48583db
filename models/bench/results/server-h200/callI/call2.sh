# stop 36 call 2: the wide-stream GPU test against float32; the in-process burst with and without other processes busy
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 200 python3 -m pytest -m gpu -q -s -p no:cacheprovider -p no:benchmark tests/test_gemv_wide_gpu.py > $OUT/gemv_wide_gpu.log 2>&1
echo "gemv wide rc=$? in $(( $(date +%s) - T0 )) s"; grep "rows:" $OUT/gemv_wide_gpu.log; tail -2 $OUT/gemv_wide_gpu.log
TR="python3 -m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate inf --rounds 2 --arms resident-triton-cache --max-running 32 --max-seq-len 2048"
timeout 220 $TR --out $OUT/a > $OUT/a.log 2>&1; echo "A (idle host) rc=$? at $(( $(date +%s) - T0 )) s"
burn() { for i in $(seq 1 6); do $1 python3 -c "while True: pass" & done; }
burn ""; sleep 1
timeout 120 $TR --out $OUT/b > $OUT/b.log 2>&1; echo "B (6 busy processes) rc=$? at $(( $(date +%s) - T0 )) s"
pkill -f "while True: pass"; sleep 1
burn "taskset -c 2-15"; sleep 1
timeout 120 taskset -c 0 $TR --out $OUT/c > $OUT/c.log 2>&1; echo "C (busy, engine on core 0, others on 2-15) rc=$? at $(( $(date +%s) - T0 )) s"
pkill -f "while True: pass"
for x in a b c; do echo "== $x"; grep -h "^round\|host load 0 " $OUT/$x.log | grep "tok/s"; done
lscpu | grep -i "model name\|MHz\|^CPU(s)" > $OUT/cpu.txt
for x in a b c; do echo "== $x"; grep "^| resident" $OUT/$x/results.md | cut -d'|' -f2,6,11,14,17,18,19,20,24,25,26; rm -f $OUT/$x/*.png; done
