"""Whisper shapes: a frozen record, its transformers twin (``to_hf``), and named configs."""

from __future__ import annotations

import attrs

ACTIVATIONS = ("gelu", "relu")  # transformers' ACT2FN names this package implements (Whisper ships "gelu")


def _positive(_inst, attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class WhisperConfig:
    """The fields of ``transformers.WhisperConfig`` that shape ``WhisperForConditionalGeneration``'s forward."""

    vocab_size: int = attrs.field(validator=_positive)
    num_mel_bins: int = attrs.field(validator=_positive)
    d_model: int = attrs.field(validator=_positive)
    encoder_layers: int = attrs.field(validator=_positive)
    encoder_attention_heads: int = attrs.field(validator=_positive)
    encoder_ffn_dim: int = attrs.field(validator=_positive)
    decoder_layers: int = attrs.field(validator=_positive)
    decoder_attention_heads: int = attrs.field(validator=_positive)
    decoder_ffn_dim: int = attrs.field(validator=_positive)
    max_source_positions: int = attrs.field(default=1500, validator=_positive)  # encoder tokens = cross context
    max_target_positions: int = attrs.field(default=448, validator=_positive)  # decoder learned positions
    decoder_start_token_id: int = 50258
    pad_token_id: int = 50257
    bos_token_id: int = 50257
    eos_token_id: int = 50257
    begin_suppress_tokens: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    activation_function: str = attrs.field(default="gelu", validator=attrs.validators.in_(ACTIVATIONS))
    tie_word_embeddings: bool = True  # proj_out.weight is model.decoder.embed_tokens.weight
    init_std: float = 0.02

    def __attrs_post_init__(self) -> None:
        for heads in (self.encoder_attention_heads, self.decoder_attention_heads):
            if self.d_model % heads:
                raise ValueError(f"d_model {self.d_model} is not divisible by {heads} heads")
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (sinusoidal encoder positions), got {self.d_model}")
        for name in ("decoder_start_token_id", "pad_token_id", "bos_token_id", "eos_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name} {getattr(self, name)} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def head_dim(self) -> int:
        """Decoder head width: d_model / decoder_attention_heads (self and cross attention alike)."""
        return self.d_model // self.decoder_attention_heads

    @property
    def n_frames(self) -> int:
        """Mel frames transformers' encoder insists on: 2 * max_source_positions (conv2 has stride 2)."""
        return 2 * self.max_source_positions

    @classmethod
    def from_hf(cls, hf) -> WhisperConfig:
        """Ours from a transformers WhisperConfig (a checkpoint's); ValueError naming a field whose value this
        implementation does not run."""
        if getattr(hf, "scale_embedding", False):
            raise ValueError("scale_embedding is True; this implementation runs unscaled embeddings only")
        return cls(
            vocab_size=hf.vocab_size, num_mel_bins=hf.num_mel_bins, d_model=hf.d_model,
            encoder_layers=hf.encoder_layers, encoder_attention_heads=hf.encoder_attention_heads,
            encoder_ffn_dim=hf.encoder_ffn_dim, decoder_layers=hf.decoder_layers,
            decoder_attention_heads=hf.decoder_attention_heads, decoder_ffn_dim=hf.decoder_ffn_dim,
            max_source_positions=hf.max_source_positions, max_target_positions=hf.max_target_positions,
            decoder_start_token_id=hf.decoder_start_token_id, pad_token_id=hf.pad_token_id,
            bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id,
            begin_suppress_tokens=tuple(hf.begin_suppress_tokens or ()), activation_function=hf.activation_function,
            tie_word_embeddings=bool(hf.tie_word_embeddings), init_std=hf.init_std,
        )  # fmt: skip

    def to_hf(self, **overrides):
        """The equivalent ``transformers.WhisperConfig`` (dropout off); ``overrides`` go to its constructor."""
        from transformers import WhisperConfig as HFWhisperConfig

        kwargs = dict(
            vocab_size=self.vocab_size,
            num_mel_bins=self.num_mel_bins,
            d_model=self.d_model,
            encoder_layers=self.encoder_layers,
            encoder_attention_heads=self.encoder_attention_heads,
            encoder_ffn_dim=self.encoder_ffn_dim,
            decoder_layers=self.decoder_layers,
            decoder_attention_heads=self.decoder_attention_heads,
            decoder_ffn_dim=self.decoder_ffn_dim,
            max_source_positions=self.max_source_positions,
            max_target_positions=self.max_target_positions,
            decoder_start_token_id=self.decoder_start_token_id,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            begin_suppress_tokens=list(self.begin_suppress_tokens) or None,
            suppress_tokens=None,
            activation_function=self.activation_function,
            tie_word_embeddings=self.tie_word_embeddings,
            init_std=self.init_std,
            scale_embedding=False,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
        )
        kwargs.update(overrides)
        return HFWhisperConfig(**kwargs)


# Test-sized: 2 + 2 layers, 4 heads of 16, 48 mel frames -> 24 encoder tokens (several cross pages at page_size 4).
tiny = WhisperConfig(
    vocab_size=128,
    num_mel_bins=16,
    d_model=64,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_layers=2,
    decoder_attention_heads=4,
    decoder_ffn_dim=128,
    max_source_positions=24,
    max_target_positions=64,
    decoder_start_token_id=125,
    pad_token_id=127,
    bos_token_id=126,
    eos_token_id=126,
)

# Shaped like openai/whisper-tiny's config.json (random init here; no hub downloads).
whisper_tiny = WhisperConfig(
    vocab_size=51865,
    num_mel_bins=80,
    d_model=384,
    encoder_layers=4,
    encoder_attention_heads=6,
    encoder_ffn_dim=1536,
    decoder_layers=4,
    decoder_attention_heads=6,
    decoder_ffn_dim=1536,
    decoder_start_token_id=50258,
    pad_token_id=50257,
    bos_token_id=50257,
    eos_token_id=50257,
    begin_suppress_tokens=(220, 50257),
)

# Shaped like openai/whisper-large-v3's config.json: 128 mel bins, 51866 tokens, 32 + 32 layers of width 1280.
whisper_large_v3 = WhisperConfig(
    vocab_size=51866,
    num_mel_bins=128,
    d_model=1280,
    encoder_layers=32,
    encoder_attention_heads=20,
    encoder_ffn_dim=5120,
    decoder_layers=32,
    decoder_attention_heads=20,
    decoder_ffn_dim=5120,
    decoder_start_token_id=50258,
    pad_token_id=50256,
    bos_token_id=50257,
    eos_token_id=50257,
    begin_suppress_tokens=(220, 50257),
)

CONFIGS: dict[str, WhisperConfig] = {"tiny": tiny, "whisper_tiny": whisper_tiny, "whisper_large_v3": whisper_large_v3}


def get_config(name: str) -> WhisperConfig:
    """A named config: one of CONFIGS' keys."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown Whisper config {name!r}; known: {sorted(CONFIGS)}") from None
