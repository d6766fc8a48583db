#!/bin/bash
# stop 33, device call 1: the lean host step. GPU engine tests; serve gate on this tree and on the base (d51d25c,
# scratch/base = `git archive d51d25c models resplan kernels`) at c=1,64 and host load 0, 0.6; host_step on the H200 host, both trees.
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
D=$OUT/d6; mkdir -p $D
git log --oneline | head -1 > $D/tree.txt
nproc > $D/host.txt; lscpu | grep -i "model name" >> $D/host.txt
timeout 120 python3 -m pytest -m gpu -q -n 4 -p no:benchmark tests/test_engine_gpu.py -k "not 5000" > $D/gpu_tests.log 2>&1; echo "rc=$?" >> $D/gpu_tests.log
tail -2 $D/gpu_tests.log
timeout 170 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,64 --arms host-overlap,host-triton-overlap,resident-triton --host-load 0,0.6 --rounds 2 --out $D/serve_new > $D/serve_new.log 2>&1
echo "serve new rc=$?" | tee -a $D/serve_new.log
(cd scratch/base && timeout 130 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,64 --arms host-triton-overlap,resident-triton --host-load 0,0.6 --rounds 2 --out $D/serve_base > $D/serve_base.log 2>&1; echo "serve base rc=$?" | tee -a $D/serve_base.log)
for t in new base; do grep "c=1 \|c=64 " $D/serve_$t/results.md | cut -c1-300 | sed "s/^/$t /"; done
(cd scratch/base && timeout 40 python3 -m models.bench.host_step --concurrency 1,64 --steps 1000 --rounds 5 > $D/host_step_base.md 2>&1)
timeout 40 python3 -m models.bench.host_step --concurrency 1,64 --steps 1000 --rounds 5 > $D/host_step_new.md 2>&1
cat $D/host_step_base.md $D/host_step_new.md
