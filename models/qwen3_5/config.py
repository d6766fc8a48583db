"""Qwen3.5 text-model configs: a frozen record, its transformers twin (``to_hf``), and the named sizes.

Sources for the published sizes (no hub access here, so no config.json was downloaded):
  * Qwen3.5-0.8B: the official model card ("Model Overview": hidden 1024, 24 layers, 6 x (3 GDN + 1 attention),
    GDN 16 V / 16 QK heads of dim 128, attention 8 Q / 2 KV heads of dim 256, rotary dim 64, FFN 3584, vocab 248320
    tied) plus two independent public mirrors of its config.json (rope_theta 1e7, partial_rotary_factor 0.25,
    mrope_section [11, 11, 10] interleaved, rms_norm_eps 1e-6, conv kernel 4, max_position_embeddings 262144,
    eos 248044).
  * Qwen3.5-2B: the official model card (same as 0.8B but hidden 2048, FFN 6144). rope_theta, eps, conv kernel,
    mrope and eos are not on the card: assumed equal to 0.8B (the family shares them; unverified for 2B).
"""

from __future__ import annotations

import attrs

LINEAR = "linear_attention"
FULL = "full_attention"


def interval_layer_types(num_layers: int, full_every: int = 4) -> tuple[str, ...]:
    """transformers' default pattern: layer i is full attention iff (i + 1) % full_every == 0."""
    return tuple(FULL if (i + 1) % full_every == 0 else LINEAR for i in range(num_layers))


@attrs.frozen
class Qwen35Config:
    """The text model's shape. Field names follow transformers' Qwen3_5TextConfig."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    layer_types: tuple[str, ...] = attrs.field(converter=tuple)
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = attrs.field(default=(11, 11, 10), converter=tuple)
    mrope_interleaved: bool = True
    max_position_embeddings: int = 262_144
    tie_word_embeddings: bool = True
    eos_token_id: int | None = None

    def __attrs_post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"{self.name}: {len(self.layer_types)} layer_types for {self.num_hidden_layers} layers")
        bad = set(self.layer_types) - {LINEAR, FULL}
        if bad:
            raise ValueError(f"{self.name}: unknown layer types {sorted(bad)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.name}: attention heads must be a multiple of KV heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"{self.name}: GDN value heads must be a multiple of key heads")

    # -- derived ---------------------------------------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        """Channels of each attention head that RoPE rotates: int(head_dim * partial_rotary_factor)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN causal conv: q, k and v together."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @classmethod
    def from_hf(cls, hf, name: str, tie_word_embeddings: bool | None = None) -> Qwen35Config:
        """Ours from a transformers Qwen3_5TextConfig (a checkpoint's text model); ValueError naming a field whose
        value this implementation does not run. ``tie_word_embeddings``: where the checkpoint decides it elsewhere
        (a Qwen3_5ForConditionalGeneration's top-level config)."""
        for field, want in (("hidden_act", "silu"), ("attention_bias", False)):
            if getattr(hf, field, want) != want:
                raise ValueError(f"{field} is {getattr(hf, field)!r}; this implementation runs {want!r} only")
        rope = dict(getattr(hf, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope['rope_type']!r}: only the default RoPE is implemented")
        theta = rope.get("rope_theta", getattr(hf, "rope_theta", None))
        factor = rope.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None))
        if theta is None or factor is None:
            raise ValueError("rope_theta and partial_rotary_factor are missing from the config")
        rot_half = int(hf.head_dim * factor) // 2
        eos = hf.eos_token_id[0] if isinstance(hf.eos_token_id, list | tuple) else hf.eos_token_id
        return cls(
            name=name, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
            num_hidden_layers=hf.num_hidden_layers, num_attention_heads=hf.num_attention_heads,
            num_key_value_heads=hf.num_key_value_heads, head_dim=hf.head_dim,
            linear_num_key_heads=hf.linear_num_key_heads, linear_num_value_heads=hf.linear_num_value_heads,
            linear_key_head_dim=hf.linear_key_head_dim, linear_value_head_dim=hf.linear_value_head_dim,
            layer_types=tuple(hf.layer_types), linear_conv_kernel_dim=hf.linear_conv_kernel_dim,
            rms_norm_eps=hf.rms_norm_eps, rope_theta=float(theta), partial_rotary_factor=float(factor),
            # text positions are the same on all three M-RoPE sections, so their split does not change the result
            mrope_section=tuple(rope.get("mrope_section") or (rot_half, 0, 0)),
            mrope_interleaved=bool(rope.get("mrope_interleaved", True)),
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(hf.tie_word_embeddings if tie_word_embeddings is None else tie_word_embeddings),
            eos_token_id=eos,
        )  # fmt: skip

    def to_hf(self):
        """The equivalent transformers.Qwen3_5TextConfig."""
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            linear_conv_kernel_dim=self.linear_conv_kernel_dim,
            linear_key_head_dim=self.linear_key_head_dim,
            linear_value_head_dim=self.linear_value_head_dim,
            linear_num_key_heads=self.linear_num_key_heads,
            linear_num_value_heads=self.linear_num_value_heads,
            layer_types=list(self.layer_types),
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            eos_token_id=self.eos_token_id,
            attention_bias=False,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": list(self.mrope_section),
                "mrope_interleaved": self.mrope_interleaved,
            },
        )


# A few layers of both kinds (GDN first, attention in the middle and at the end), GDN with 2 key heads shared by 4
# value heads so the head repetition is exercised; small enough for fast CPU tests.
tiny = Qwen35Config(
    name="tiny",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    layer_types=(LINEAR, FULL, LINEAR, FULL),
    rope_theta=10_000.0,
    mrope_section=(2, 1, 1),  # sums to rotary_dim / 2 = 4
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)

qwen3_5_0_8b = Qwen35Config(
    name="qwen3_5_0_8b",
    vocab_size=248_320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    layer_types=interval_layer_types(24),
    eos_token_id=248_044,
)

qwen3_5_2b = attrs.evolve(qwen3_5_0_8b, name="qwen3_5_2b", hidden_size=2048, intermediate_size=6144)

CONFIGS = {c.name: c for c in (tiny, qwen3_5_0_8b, qwen3_5_2b)}
