# call 2 (stop 54): v2 (the row's bound by its last group-max program; bans only on banned rows): compiled tests (sample, argmax, gemv split-K after the fence moved), per-launch profile, A/B old/v1/v2/torch, sweep
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc; T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/times.txt
timeout 150 python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m "" tests/test_sample.py tests/test_argmax.py -x -rfE > $OUT/tests.log 2>&1; echo "sample tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 60 python3 -m scratch.samp2.prof > $OUT/prof.txt 2>&1; echo "prof rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
timeout 240 python3 -m scratch.samp2.ab --sweep > $OUT/ab.md 2>&1; echo "ab rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt
left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 30 ] && { timeout $left python3 -m pytest -q -p no:benchmark -p no:cacheprovider -m gpu tests/test_gemv_silu.py tests/test_gemv_norm.py tests/test_decode_kernels.py -k "split" -x -rfE > $OUT/gemv_tests.log 2>&1; echo "gemv split tests rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/times.txt; }
cat $OUT/times.txt; tail -3 $OUT/tests.log; grep -v Warn $OUT/prof.txt | grep rows; cat $OUT/ab.md; tail -3 $OUT/gemv_tests.log
