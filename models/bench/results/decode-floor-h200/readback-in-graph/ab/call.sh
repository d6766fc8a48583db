source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
mkdir -p /tmp/base && tar -xzf scratch/base.tar.gz -C /tmp/base && cp -r .device /tmp/base/
SERVE="--model qwen3_5-0.8b --concurrency 1,16 --prompt-len 512 --gen 256 --rounds 3 --arms host-triton-overlap,resident-triton --host-load 0,0.6"
timeout 200 python3 -m models.bench.serve $SERVE --out $OUT/new1 > $OUT/serve_new1.log 2>&1
echo "new1 rc=$? at $(( $(date +%s) - T0 )) s"
(cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base timeout 200 python3 -m models.bench.serve $SERVE --out $OUT/base1 > $OUT/serve_base1.log 2>&1; echo "base1 rc=$? at $(( $(date +%s) - T0 )) s")
for d in new1 base1; do echo "## $d"; grep -E "^\| qwen" $OUT/$d/results.md | awk -F'|' '{print $2,$3,$4,"|",$7,"|",$10,"| step",$16,"launch",$19,"wait",$20}'; done
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
left=$(( 570 - ($(date +%s) - T0) ))
echo "gpu tests with ${left} s"
timeout $left python3 -m pytest -m gpu -q -x -n 4 -p no:benchmark tests/test_engine_gpu.py -k "not 5000" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/gpu_tests.log
