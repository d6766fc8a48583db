#!/bin/bash
# stop 33, device call 3: the serve gate on the final tree (c=1,16,64; host load 0, 0.6); host_step and the
# resident engine's host profile on the H200's host
source .device/enter.sh; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
D=$OUT/d8; mkdir -p $D
git log --oneline | head -1 > $D/tree.txt
timeout 300 python3 -m models.bench.serve --model qwen3_5-0.8b --concurrency 1,16,64 --arms host-overlap,host-triton-overlap,resident-triton --host-load 0,0.6 --rounds 2 --out $D/serve > $D/serve.log 2>&1
echo "serve rc=$?" | tee -a $D/serve.log
grep "c=" $D/serve/results.md | cut -c1-320
timeout 40 python3 -m models.bench.host_step --concurrency 1,64 --steps 1000 --rounds 5 > $D/host_step.md 2>&1
cat $D/host_step.md
timeout 120 python3 models/bench/results/decode-floor-h200/host_profile.py > $D/hostprof.txt 2>&1; echo "rc=$?" >> $D/hostprof.txt
grep "^## c=" $D/hostprof.txt
