"""Tensor parallelism for Qwen3.5: one shard of the model per rank, Megatron style.

Column-parallel (each rank a contiguous block of output rows): the attention's q|gate, k and v projections by heads,
the GDN's q, k and v (its conv channels with them), z, b and a by heads, A_log and dt_bias by value head, the MLP's
gate and up by intermediate rows. Row-parallel (each rank the matching block of input columns): o_proj, the GDN's
out_proj, the MLP's down_proj, each followed by one all-reduce of the sublayer's output (``Qwen35Model._reduce``).
Replicated: the embedding, every norm, the lm_head. The lm_head stays whole on every rank so that each rank samples
the same token from the same logits (the all-reduced hidden state is the same on every rank) and no rank has to
gather logits or broadcast tokens; it costs vocab x hidden weights a rank (0.5 GB at the 2B shape in bf16).

A shard is a Qwen35Model of a config whose head and intermediate counts are divided by the world size: every layer's
code runs unchanged on its share, pools included (each rank pages its own KV heads and holds its own GDN heads'
states; slot and page numbers never leave a rank). Value head h still reads key head h // (hv / hk): the blocks keep
the ratio.
"""

from __future__ import annotations

import attrs
import torch
import torch.distributed as dist

from models.qwen3_5.config import Qwen35Config
from models.qwen3_5.model import Qwen35Model


@attrs.frozen(eq=False)
class TensorParallel:
    """This process's place in a tensor-parallel group: rank, world size, the torch.distributed group."""

    rank: int
    world: int
    group: object = None  # a torch.distributed ProcessGroup; None: the default group

    def leave(self) -> None:
        """Leave the group, every rank at once (a barrier first: gloo aborts a process whose peer tore its sockets down
        first); call once, on every rank, at the end."""
        dist.barrier(group=self.group)
        dist.destroy_process_group(self.group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place (every rank ends with the same tensor)."""
        dist.all_reduce(x, group=self.group)
        return x


def shard_config(cfg: Qwen35Config, world: int) -> Qwen35Config:
    """The config of one rank's shard: head counts and the intermediate size divided by ``world`` (refused with the
    count that does not divide)."""
    counts = {"num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
              "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
              "intermediate_size": cfg.intermediate_size}  # fmt: skip
    bad = {k: v for k, v in counts.items() if v % world}
    if world < 1 or bad:
        raise ValueError(f"{cfg.name}: cannot split over {world} ranks: {bad} not divisible")
    return attrs.evolve(cfg, **{k: v // world for k, v in counts.items()})


def shard_state_dict(sd: dict[str, torch.Tensor], cfg: Qwen35Config, rank: int, world: int) -> dict[str, torch.Tensor]:
    """The full model's state dict (transformers' names) cut to rank ``rank``'s shard (module doc)."""
    d, kd, vd = cfg.head_dim, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads

    def rows(t: torch.Tensor, n: int, start: int = 0) -> torch.Tensor:  # rank's block of n rows from ``start``
        return t[start + rank * n : start + (rank + 1) * n]

    def gdn_channels(t: torch.Tensor) -> torch.Tensor:  # [q | k | v] rows (or conv channels): each part's block
        qk, v = hk * kd, hv * vd
        return torch.cat([rows(t, qk // world), rows(t, qk // world, qk), rows(t, v // world, 2 * qk)])

    out = {}
    for name, t in sd.items():
        leaf = name.rsplit(".", 2)[-2:]
        mod, param = leaf[0], leaf[1]
        if mod == "q_proj":
            out[name] = rows(t, cfg.num_attention_heads * 2 * d // world)
        elif mod in ("k_proj", "v_proj"):
            out[name] = rows(t, cfg.num_key_value_heads * d // world)
        elif mod == "o_proj":
            out[name] = rows(t.t(), cfg.num_attention_heads * d // world).t().contiguous()
        elif mod in ("in_proj_qkv", "conv1d"):
            out[name] = gdn_channels(t)
        elif mod == "in_proj_z":
            out[name] = rows(t, hv * vd // world)
        elif mod in ("in_proj_b", "in_proj_a") or (mod == "linear_attn" and param in ("A_log", "dt_bias")):
            out[name] = rows(t, hv // world)  # one a value head
        elif mod == "out_proj":
            out[name] = rows(t.t(), hv * vd // world).t().contiguous()
        elif mod in ("gate_proj", "up_proj"):
            out[name] = rows(t, cfg.intermediate_size // world)
        elif mod == "down_proj":
            out[name] = rows(t.t(), cfg.intermediate_size // world).t().contiguous()
        else:  # embeddings, norms, lm_head: replicated
            out[name] = t
        out[name] = out[name].clone()
    return out


def shard_model(model: Qwen35Model, tp: TensorParallel) -> Qwen35Model:
    """Rank ``tp.rank``'s shard of ``model`` (a Qwen35Model holding the full weights), a new Qwen35Model on the same
    device and dtype whose sublayer outputs are all-reduced over ``tp``'s group."""
    w = model.lm_head.weight
    shard = Qwen35Model(shard_config(model.cfg, tp.world)).to(device=w.device, dtype=w.dtype)
    shard.load_state_dict(shard_state_dict(model.state_dict(), model.cfg, tp.rank, tp.world))
    shard.tp = tp
    return shard.eval()
