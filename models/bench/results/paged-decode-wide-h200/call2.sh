# call 2 (session 43): GPU tests of de227a5; attention at 16-64 rows in wide tables; the engine at a 262k context, old and new kernel
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider -p no:benchmark -n 4 tests/test_paged_decode.py tests/test_engine_gpu.py -k "paged or triton" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? in $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_tests.log
A="--ctx 640 --batches 16,64 --iters 100 --table-ctx 262144"
timeout 60 python3 -m models.bench.attention $A --backends xqa,triton > $OUT/att_new_wide.md 2>&1
(cd scratch/oldtree && timeout 60 python3 -m models.bench.attention $A --backends triton) > $OUT/att_old_wide.md 2>&1
for f in $OUT/att_*; do echo "## $f"; grep -E "^\| *[0-9]|Error" $f | head -8; done
echo "attention at $(( $(date +%s) - T0 )) s"
W="--no-progress --num-requests 64 --rate inf --prompt-len lognormal:median=256,sigma=0.9,min=32,max=1536 --gen-len lognormal:median=96,sigma=0.9,min=8,max=384 --max-running 32 --rounds 1 --arms resident-triton --num-pages 8192"
run() { local tag=$1 dir=$2; shift 2; left=$(( 585 - ($(date +%s) - T0) )); [ $left -gt 40 ] || { echo "skip $tag"; return; }
  (cd $dir && timeout $left python3 -m models.bench.traffic $W --out $OUT/tr_$tag "$@") > $OUT/tr_$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| resident" $OUT/tr_$tag/results.md | cut -d'|' -f2-9,13-15 ; }
run new2048 . --max-seq-len 2048
run new262k . --max-seq-len 262144
run old262k scratch/oldtree --max-seq-len 262144
run new262k_b . --max-seq-len 262144
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
echo "done at $(( $(date +%s) - T0 )) s"
