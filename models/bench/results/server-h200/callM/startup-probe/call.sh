source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
timeout 60 python3 -m models.bench.make_checkpoint --model qwen3_5-0.8b --out /tmp/q08 > $OUT/make.log 2>&1
echo "checkpoint rc=$? at $(( $(date +%s) - T0 )) s"
python3 -X importtime -c "import torch, models.engine.driver, models.server.engine_core, kernels.gdn_prefill.kernel, fla.ops.utils, flashinfer" 2> $OUT/importtime.txt
sort -t'|' -k2 -n -r $OUT/importtime.txt | head -40 > $OUT/importtime_top.txt
for r in cold warm; do timeout 120 python3 scratch/startup_probe.py /tmp/q08 time > $OUT/start_$r.log 2>&1; echo "start $r rc=$? at $(( $(date +%s) - T0 )) s"; cat $OUT/start_$r.log | grep "^\["; done
timeout 90 python3 scratch/startup_probe.py /tmp/q08 profile > $OUT/start_prof.log 2>&1; echo "prof rc=$? at $(( $(date +%s) - T0 )) s"
head -3 $OUT/importtime_top.txt
left=$(( 570 - ($(date +%s) - T0) ))
timeout $left python3 -m pytest -m gpu -q -p no:benchmark tests/test_traffic_gpu.py > $OUT/traffic_gpu.log 2>&1
echo "traffic tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/traffic_gpu.log
