# call A (stop 47): held launches' GPU test, the engine GPU tests and the prompt-logprobs kernel test; then held launches against the tree before them in serve, idle and busy host
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); git log --oneline -1; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python3 -c "
import torch; torch.zeros(1, device='cuda'); from resplan.held import HeldCuda, runtime_path
print('cudart:', runtime_path(open('/proc/self/maps').read()), HeldCuda.load(), hasattr(torch.cuda.CUDAGraph, 'raw_cuda_graph_exec'))"
timeout 200 python3 -m pytest -m gpu -q -n 6 --dist loadfile -p no:benchmark tests/test_graph_gpu.py tests/test_engine_gpu.py tests/test_prefill_kernels_gpu.py -rfE > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 )) s"; tail -15 $OUT/gpu_tests.log | cut -c1-300
A="--model qwen3_5-0.8b --concurrency 1,16 --prompt-len 512 --gen 256 --rounds 2 --arms host-triton-overlap,resident-triton --host-load 0,0.6"
run() { local tag=$1 dir=$2 lim=$3; shift 3
  (cd $dir && timeout $lim python3 -m models.bench.serve $A "$@" --out $OUT/$tag) > $OUT/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - T0 )) s"
  grep -E "^\| qwen" $OUT/$tag/results.md | awk -F'|' '{print $2,$3,$4,"|",$7,"|",$10,"| step",$16,"plan",$17,"launch",$19,"wait",$20}'; }
left=$(( 580 - ($(date +%s) - T0) )); half=$(( left / 2 ))
run new . $half
left=$(( 585 - ($(date +%s) - T0) ))
run old scratch/oldtree $left
find $OUT -name "*.png" -delete; find $OUT -name "*.json" -delete
echo "done at $(( $(date +%s) - T0 )) s"
