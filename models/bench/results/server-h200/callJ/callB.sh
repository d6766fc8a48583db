source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
ROOT=$PWD; T0=$(date +%s)
timeout 200 python3 scratch/chat_diverge.py $OUT/chat_new > $OUT/chat_new.log 2>&1
echo "chat new rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "round|request" $OUT/chat_new.log | grep -v "tok/s" | head -30
grep -E "^\| resident" $OUT/chat_new/results.md | awk -F'|' '{print $2, $6, $11, $(NF-4), $(NF-3), $(NF-2)}'
(cd scratch/base && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 chat_diverge.py $OUT/chat_base > $OUT/chat_base.log 2>&1)
echo "chat base rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "round|request" $OUT/chat_base.log | grep -v "tok/s" | head -30
grep -E "^\| resident" $OUT/chat_base/results.md | awk -F'|' '{print $2, $6, $11, $(NF-4), $(NF-3), $(NF-2)}'
for i in 1 2; do
 for t in new base; do
  if [ $t = base ]; then cd scratch/base; P=/tmp/site:$PWD; else P=/tmp/site:$PWD; fi
  PYTHONPATH=$P timeout 120 python3 -m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate inf --rounds 1 --arms resident-triton-cache --max-running 32 --max-seq-len 2048 --no-progress --out $OUT/burst_${t}_$i > $OUT/burst_${t}_$i.log 2>&1
  echo "burst $t $i rc=$? at $(( $(date +%s) - T0 )) s"; grep "^round" $OUT/burst_${t}_$i.log
  cd $ROOT
 done
done
