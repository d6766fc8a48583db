source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 170 python3 -m pytest -m gpu -q -n 3 -p no:benchmark tests/test_engine_gpu.py tests/test_graph_gpu.py -k "k_tokens or logprobs or split_k" > $OUT/gpu_k.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|launches|Error" $OUT/gpu_k.log | tail -8
timeout 230 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,16 --prompt-len 512 --gen 256 --rounds 2 --arms host-triton-overlap,resident-triton,resident-triton-k4 --host-load 0,0.6 --out $OUT/k4 > $OUT/k4.log 2>&1
echo "serve rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^\| qwen" $OUT/k4/results.md | awk -F'|' '{print $2,$3,$4,"|",$7,"|",$9,"|",$10,"| step",$16,"launch",$19,"wait",$20}'
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
left=$(( 570 - ($(date +%s) - T0) ))
echo "traffic with ${left} s"
timeout $left python3 -m models.bench.traffic --model qwen3_5-0.8b --num-requests 128 --rate inf --arms resident-triton,resident-triton-k4 --rounds 2 --out $OUT/tr > $OUT/traffic.log 2>&1
echo "traffic rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "^\|" $OUT/tr/results.md 2>/dev/null | head -12 || tail -5 $OUT/traffic.log
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
