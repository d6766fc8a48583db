# issue 24: the layer tail sweep (acquire-load barrier), its GPU tests, the step at the fastest config
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name $(date +%T)" > $OUT/times.txt
left() { echo $(( ${TOTAL:-560} - ($(date +%s) - T0) )); }
lim() { echo $(( $1 < $(left) ? $1 : $(left) )); }
C=8,4,8,16,0,16,1/2,2,2,8,0,4,4/8,4,8,16,1024,8,1/4,4,4,16,0,8,2/2,4,2,8,0,8,2/4,2,4,8,0,4,3/8,8,8,16,0,8,1/2,2,2,4,512,4,2
timeout $(lim 200) python3 -m models.bench.layer_tail --rounds 5 --iters 100 --configs $C > /tmp/b_sweep.md 2>&1
echo "sweep rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
read cfg tail chain < <(python3 scratch/next63/pick.py /tmp/b_sweep.md); echo "best $cfg tail $tail chain $chain" >> $OUT/times.txt
L=off; if [ -n "$cfg" ] && python3 -c "import sys; sys.exit(0 if float('$tail') < float('$chain') else 1)"; then
  sed -i "s/^DEFAULT_CONFIG = .*/DEFAULT_CONFIG = ($cfg)/" kernels/layer_tail/kernel.py; L=off,on; fi
[ $(left) -gt 40 ] && timeout $(lim 120) python3 -m models.bench.decode_profile --paths fused --sampler greedy --attention triton --batches 1,16,64 --rounds 3 --iters 200 --layer-tail $L > /tmp/p_step.md 2>&1
echo "profile rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
[ $(left) -gt 20 ] && timeout $(lim 150) python3 -m pytest -q -x -p no:benchmark -p no:cacheprovider -m gpu tests/test_layer_tail.py -s > /tmp/t_tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s" >> $OUT/times.txt
cp /tmp/b_sweep.md /tmp/p_step.md $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls t_*.log b_*.md p_*.md 2>/dev/null) 2>/dev/null
cat $OUT/times.txt; grep -E "passed|failed|Error|max \|" /tmp/t_tests.log | tail -6; grep -E "^\| (chain|tail)|Error|Left" /tmp/b_sweep.md | cut -c1-170; grep -E "^\| [0-9]+ " /tmp/p_step.md
