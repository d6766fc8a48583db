# call 3 (session 43): serve_http's paired rounds on the burst; the engine at a 262k context, old and new paged-decode kernel
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 330 python3 -m models.bench.serve_http --model-dir /tmp/q08 --make qwen3_5-0.8b --out $OUT/sh --rounds 3 --workloads burst > $OUT/serve_http.log 2>&1
echo "serve_http rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^- |^\| " $OUT/sh/results.md 2>/dev/null | cut -c1-900 || tail -5 $OUT/serve_http.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete; rm -rf $OUT/sh/*-http $OUT/sh/*-engine
W="--no-progress --num-requests 64 --rate inf --prompt-len lognormal:median=256,sigma=0.9,min=32,max=1536 --gen-len lognormal:median=96,sigma=0.9,min=8,max=384 --max-running 32 --rounds 1 --arms resident-triton --num-pages 16400"
run() { local tag=$1 dir=$2; shift 2; left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 40 ] || { echo "skip $tag"; return; }
  (cd $dir && timeout $left python3 -m models.bench.traffic $W --out $OUT/tr_$tag "$@") > $OUT/tr_$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| resident" $OUT/tr_$tag/results.md | cut -d'|' -f2-9,13-15 ; }
run new262k . --max-seq-len 262144
run old262k scratch/oldtree --max-seq-len 262144
run new2048 . --max-seq-len 2048
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
echo "done at $(( $(date +%s) - T0 )) s"
