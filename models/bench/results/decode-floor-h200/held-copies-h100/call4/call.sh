# stop 67 call 4: TTFT at c=64 under load 0.6: ef9dd13 (base), the held copies (new), and new with the launcher's ids
# copies through torch (newL); resident-triton, alternated, three rounds
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
B=${BUDGET:-400}; left() { echo $(( B - ($(date +%s) - T0) )); }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T) $(nproc) cpus" > $OUT/times.txt
for r in 1 2 3; do for tree in new base newL; do
  L=$(left); [ $L -lt 35 ] && break 2
  case $tree in base) D=$PWD/scratch/next67/base;; newL) D=$PWD/scratch/next67/newL;; *) D=$PWD;; esac
  (cd $D && PYTHONPATH=/tmp/site:$D timeout $(( L - 5 )) python3 -m models.bench.serve --model qwen3_5-0.8b \
    --concurrency 64 --arms resident-triton --host-load 0.6 --rounds 1 --out /tmp/s_${tree}$r \
    > /tmp/s_${tree}$r.log 2>&1)
  echo "serve $tree $r rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
  cp /tmp/s_${tree}$r/results.md $OUT/ttft_${tree}$r.md 2>/dev/null || tail -5 /tmp/s_${tree}$r.log
  grep -E "^\| qwen" /tmp/s_${tree}$r/results.md | awk -F'|' -v t=$tree -v r=$r '{print t" "r" |"$3"|"$4"|"$7"|"$11"|"$13"|"$15"|"$23}' >> $OUT/summary.txt
done; done
cat $OUT/times.txt $OUT/summary.txt
