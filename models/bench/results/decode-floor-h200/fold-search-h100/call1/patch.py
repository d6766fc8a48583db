"""NORM_CONFIGS from $NORM_JSON (every searched pick, used or not: an A/B measures them in the step)."""
import json
import os

import kernels.gemv.kernel as k

with open(os.environ["NORM_JSON"]) as f:
    picks = json.load(f)
for key, cfg, _ in picks:
    k.NORM_CONFIGS[tuple(key)] = tuple(cfg)
print("<!-- NORM_CONFIGS", k.NORM_CONFIGS, "-->", flush=True)
