# call 1 (stop 48): the whole GPU suite; the one-row step's census with PDL off and on
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); git log --oneline -1; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16 --pdl off,on --rounds 2 --iters 200 --top 40 > $OUT/census_pdl.md 2> $OUT/census_pdl.err
echo "census rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "^\| (1|16) " $OUT/census_pdl.md | head; tail -3 $OUT/census_pdl.err
timeout 420 python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark tests -rfE > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -25 $OUT/gpu_tests.log | cut -c1-300
pkill -f xdist; pkill -f "pytest" ; echo "done at $(( $(date +%s) - T0 )) s"
