"""The layers' tails at one row: today's kernel chain against one persistent launch a layer (GPU).

    python -m models.bench.layer_tail --model qwen3_5-0.8b --rounds 5 --iters 100 \
        --configs 8,4,8,16,0,16,1/2,2,2,8,0,4,4

A layer's tail is its out projection, the MLP and the next layer's input projection with the residual adds and norms
between them (``kernels.layer_tail``). Each arm runs the tails of every layer of the model's shape (random bf16
weights; the next projection is the next layer's, GDN or attention, and the last layer's is the first's), with one
small PDL kernel standing for each layer's mixer (silu_mul of the projection's first 2D columns into the next tail's
input), captured as one CUDA graph; the graphs replay alternated, ``--iters`` a round. Arms:

- ``chain``: today's fused decode dispatch (``models.layers.fused``: the out projection's weight stream, the norm
  folded into gate|up, silu_mul folded into down, the norm folded into the next projection), 4 kernels a tail;
- ``tail``: ``kernels.layer_tail.layer_tail``, one persistent launch a tail (grid barriers between projections);
- ``tail-phases``: the same kernel launched once a projection (4 launches, no barriers): what persistence buys.

The two tail arms run at each of ``--configs``, all captured before any is timed, so that every configuration is
timed in the same rounds as the chain. A configuration whose persistent programs cannot all be resident at once is
reported and left out.

Reported: median GPU us a replay [min-max over rounds], the floor (the tails' weight bytes over what a 1 GiB device
copy moves), each arm's ratio to ``chain`` paired by round, and the largest difference of each arm's outputs (the last
projection and residual) from ``chain``'s.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from kernels.choices import KernelChoices
from kernels.gates import silu_mul
from kernels.layer_tail import DEFAULT_CONFIG, layer_tail
from models.bench.decode_profile import copy_bandwidth
from models.bench.timing import replay_us
from models.cli import OneLineParser, positive_int
from models.engine.adapters import MODEL_CONFIGS
from models.layers.fused import PendingNorm, Residual, decode_linear, decode_normed_linear, decode_silu_mul_linear
from models.qwen3_5.config import LINEAR, Qwen35Config
from resplan import Graph

EPS = 1e-6


def _weights(cfg: Qwen35Config, device: torch.device, gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """Per layer: wo [H, D], nw1 [H], wgu [2I, H], wd [H, I], nw_in [H], w_in [NP, H] (random, bf16)."""
    H, I = cfg.hidden_size, cfg.intermediate_size  # noqa: E741 (the MLP's width, as in the module doc)
    gdn_in = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + 2 * cfg.linear_num_value_heads * (
        cfg.linear_value_head_dim) + 2 * cfg.linear_num_value_heads  # qkv | z | b | a
    attn_in = 2 * cfg.num_attention_heads * cfg.head_dim + 2 * cfg.num_key_value_heads * cfg.head_dim
    gdn_d = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    attn_d = cfg.num_attention_heads * cfg.head_dim

    def r(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=torch.bfloat16)

    layers = []
    for kind in cfg.layer_types:
        d = gdn_d if kind == LINEAR else attn_d
        n_in = gdn_in if kind == LINEAR else attn_in
        layers.append({"wo": r(H, d, scale=d**-0.5), "nw1": r(H, scale=0.1), "wgu": r(2 * I, H, scale=H**-0.5),
                       "wd": r(H, I, scale=I**-0.5), "nw_in": r(H, scale=0.1), "w_in": r(n_in, H, scale=H**-0.5)})
    return layers


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("--model", default="qwen3_5-0.8b", choices=["qwen3_5-0.8b", "qwen3_5-2b"],
                   help="the shape (random weights)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds, the arms alternated in each")
    p.add_argument("--iters", type=positive_int, default=100, help="replays a round and arm")
    p.add_argument("--arms", default="chain,tail,tail-phases", help="comma-separated: chain, tail, tail-phases")
    p.add_argument("--configs", default=",".join(map(str, DEFAULT_CONFIG)),
                   help="layer_tail configurations, /-separated, each BN_OUT,BN_GU,BN_DOWN,BN_NEXT,BK (0: whole "
                        "rows),warps,programs a multiprocessor (default: kernels.layer_tail.DEFAULT_CONFIG)")
    return p


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("layer_tail measures GPU kernels: no CUDA device here")
    dev = torch.device("cuda")
    cfg = MODEL_CONFIGS[a.model]
    try:
        configs = [tuple(int(v) for v in c.split(",")) for c in a.configs.split("/")]
    except ValueError:
        msg = f"--configs: comma-separated integers, /-separated configurations; got {a.configs!r}"
        raise SystemExit(msg) from None
    if any(len(c) != len(DEFAULT_CONFIG) for c in configs):
        raise SystemExit(f"--configs: each configuration has {len(DEFAULT_CONFIG)} entries; got {a.configs!r}")
    layers = _weights(cfg, dev, torch.Generator().manual_seed(0))
    kc = KernelChoices().resolved()
    H = cfg.hidden_size
    gen = torch.Generator().manual_seed(1)
    y0 = (torch.randn(1, layers[0]["wo"].shape[1], generator=gen)).to(device=dev, dtype=torch.bfloat16)
    h0 = (torch.randn(1, H, generator=gen) * 3).to(device=dev, dtype=torch.bfloat16)
    kinds = a.arms.split(",")
    bad = set(kinds) - {"chain", "tail", "tail-phases"}
    if bad:
        raise SystemExit(f"unknown arms: {sorted(bad)}")
    # (label, kind, config): the chain once, each tail kind at each configuration
    arms = [("chain", "chain", None)] if "chain" in kinds else []
    arms += [(f"{k} {','.join(map(str, c))}", k, c) for c in configs for k in kinds if k != "chain"]

    def run(arm: str, config: tuple[int, ...] | None, res: Residual) -> torch.Tensor:
        """Every layer's tail and mixer stand-in from (y0, res.h): the last projection [1, NP]."""
        y, p = y0, None
        for i, w in enumerate(layers):
            nxt = layers[(i + 1) % len(layers)]
            if arm == "chain":
                d1 = decode_linear(y, w["wo"], kc)
                gu = decode_normed_linear(PendingNorm(res, d1, w["nw1"], EPS), w["wgu"], kc)
                d2 = decode_silu_mul_linear(gu, w["wd"], kc)
                p = decode_normed_linear(PendingNorm(res, d2, nxt["nw_in"], EPS), nxt["w_in"], kc)
            else:
                p = layer_tail(y, res.h, w["wo"], w["nw1"], EPS, w["wgu"], w["wd"], res.take_spare(), nxt["nw_in"],
                               EPS, nxt["w_in"], persistent=arm == "tail", config=config, pdl=kc.pdl)  # fmt: skip
                res.swap()
            y = silu_mul(p[:, : 2 * nxt["wo"].shape[1]], pdl=kc.pdl)  # the mixer's stand-in: [1, D]
        return p

    graphs, outs, refused = {}, {}, []
    for label, kind, config in arms:
        res = Residual(h0.clone())
        res.take_spare()
        try:
            run(kind, config, Residual(h0.clone()))  # (eagerly first: layer_tail checks its programs fit)
            graphs[label] = Graph(lambda label=label, kind=kind, config=config, res=res: outs.__setitem__(
                label, (run(kind, config, res), res)), dev)  # fmt: skip
        except ValueError as e:  # (layer_tail's refusal of programs that cannot all be resident)
            refused.append(f"{label}: {e}")
    arms = [arm for arm in arms if arm[0] in graphs]
    results = {}
    for label, *_ in arms:  # one replay from the same inputs: the outputs against chain's
        graphs[label].replay()
        torch.cuda.synchronize()
        p, res = outs[label]
        results[label] = (p.float().clone(), res.h.float().clone())
    bw = copy_bandwidth(dev)
    weight_bytes = sum(t.numel() * t.element_size() for w in layers for k, t in w.items() if k in ("wo", "wgu", "wd"))
    weight_bytes += sum(w["w_in"].numel() * 2 for w in layers)
    floor = weight_bytes / bw * 1e6  # (as decode_profile's floor: the copy's read plus written bytes a second)
    times: dict[str, list[float]] = {label: [] for label, *_ in arms}
    for _ in range(a.rounds):
        for label, *_ in arms:
            times[label].append(replay_us(graphs[label], a.iters))
    gpu = torch.cuda.get_device_name(dev)
    print(f"# the layers' tails at one row on {gpu}: {a.model}, {len(layers)} layers, bf16\n")
    print("Tail arms are labelled by their configuration (BN_OUT,BN_GU,BN_DOWN,BN_NEXT,BK,warps,programs a "
          "multiprocessor).\n")
    for line in refused:
        print(f"Left out: {line}\n")
    print(f"A device copy moves {bw / 1e12:.2f} TB/s (read + written); the tails read {weight_bytes / 1e6:.0f} MB of "
          f"weights: a floor of {floor:.0f} us.\n")  # fmt: skip
    print("| arm | GPU us / replay | of the floor | vs chain (paired by round) | max diff p vs chain | "
          "max diff residual vs chain |")
    print("|---|---|---|---|---|---|")
    for arm, *_ in arms:
        t = times[arm]
        med = statistics.median(t)
        ratio = ""
        if "chain" in times:
            rs = sorted(x / c for x, c in zip(t, times["chain"], strict=True))
            ratio = f"{statistics.median(rs):.3f} [{rs[0]:.3f}-{rs[-1]:.3f}]"
        dp = dr = ""
        if "chain" in results:
            dp = f"{(results[arm][0] - results['chain'][0]).abs().max().item():.3g}"
            dr = f"{(results[arm][1] - results['chain'][1]).abs().max().item():.3g}"
        print(f"| {arm} | {med:.1f} [{min(t):.1f}-{max(t):.1f}] | {floor / med:.0%} | {ratio} | {dp} | {dr} |")
    scale = results[arms[0][0]][0].abs().max().item()
    print(f"\n(the last projection's largest magnitude: {scale:.3g})")


if __name__ == "__main__":
    main()
