"""Greedy tokens of the resident engine (resident-triton beside, whole prompts) with a float32 and a bfloat16 GDN
state (``EngineConfig.state_dtype``) against transformers' generate on the same random Qwen3.5-0.8B weights in bf16:
16 prompts of 256 tokens, 128 new tokens each, one batch in transformers (equal lengths, no padding). Per arm: the
requests whose 128 tokens all equal transformers', and the mean length of the common prefix. Run from the repository
root on the H200 (device call 4 of RESULTS.md)."""

import numpy as np
import torch
import transformers

from models.bench.arms import Arm, Budget
from models.bench.serve import requests
from models.engine import Engine, build_adapter
from models.engine.config import PrefillPlacement

C, P, G = 16, 256, 128


def prefix(a: list[int], b: list[int]) -> int:
    """The length of the common prefix of a and b."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
hf = transformers.Qwen3_5ForCausalLM(adapter.model.cfg.to_hf()).to(device="cuda", dtype=torch.bfloat16)
hf.load_state_dict(adapter.model.state_dict(), strict=True)
hf.eval()
reqs = requests(adapter.vocab_size, C, P, G, seed=1)
ids = torch.tensor([r.prompt for r in reqs], device="cuda")
with torch.no_grad():
    out = hf.generate(ids, max_new_tokens=G, min_new_tokens=G, do_sample=False, pad_token_id=0, eos_token_id=None,
                      attention_mask=torch.ones_like(ids))  # fmt: skip
want = out[:, P:].tolist()
arm = Arm.of("resident-triton", PrefillPlacement.BESIDE, Budget.WHOLE, "cuda")
got = {}
for sd in (torch.float32, torch.bfloat16):
    cfg = arm.config(device="cuda", dtype=torch.bfloat16, max_running=C, max_seq_len=P + G, prefill_graphs=6,
                     state_dtype=sd)  # fmt: skip
    got[sd] = [list(r.tokens) for r in Engine(adapter, cfg).run(reqs)]
    same = [prefix(g, w) for g, w in zip(got[sd], want, strict=True)]
    print(f"state {sd}: {sum(s == G for s in same)}/{C} requests equal to transformers in all {G} tokens, common "
          f"prefix mean {np.mean(same):.1f} (min {min(same)})")
both = [prefix(a, b) for a, b in zip(got[torch.float32], got[torch.bfloat16], strict=True)]
print(f"float32 against bfloat16 state: {sum(s == G for s in both)}/{C} equal, common prefix mean {np.mean(both):.1f}")
