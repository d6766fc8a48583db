# /tmp/fe_<arm>: a copy of the tree (models, kernels, resplan) with its arm's engine_core.py (the gathering printed;
# q2: BURST_QUIET_MS = 2; h: queued-hint.patch), and in each copy front_end.py's stand-in asked for
# EngineSpec(burst_wait_ms=5.0) and engine_core.run_core's pass bound 2048 where the engine has no config
. /work/main/.venv/bin/activate
for r in 1 2; do for a in q1 q2 h; do
  (cd /tmp/fe_$a && rm -rf out_$r && timeout 300 python -m models.bench.front_end --out /tmp/fe_$a/out_$r --rounds 3 --gen 16 --prompt 300 > /tmp/fe_$a/run_$r.log 2>&1)
done; done
