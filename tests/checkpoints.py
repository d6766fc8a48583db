"""Tiny Hugging Face model directories made on the spot (no downloads): transformers' save_pretrained of random
Qwen3.5 (both classes) and Whisper models, a byte-level BPE tokenizer trained with the tokenizers library, and
generation configs. The tests of checkpoint loading, text and the generate command read them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from models.qwen3_5.config import FULL, LINEAR, Qwen35Config

VOCAB = 320  # the tokenizer's 300 tokens fit
CORPUS = ["the resident planner keeps each request's rows on the device, and the host sends what changed",
          "café, naïve, jalapeño: 日本語のテキスト 😀🚀 emoji and accents",
          "the quick brown fox jumps over the lazy dog",
          "paged attention reads a block table; a page holds sixteen tokens"] * 40
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
WHISPER_SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>",
                    "<|notimestamps|>", "<|startofprev|>"]  # fmt: skip

QWEN = Qwen35Config(
    name="tiny-ckpt", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=16, layer_types=(LINEAR, FULL, LINEAR, FULL), rope_theta=10_000.0,
    mrope_section=(2, 1, 1), max_position_embeddings=512, tie_word_embeddings=False,
)  # fmt: skip


def tokenizer(specials: list[str], chat: bool):
    """A transformers fast tokenizer: byte-level BPE of 300 tokens, ``specials`` first (ids 0, 1, ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[0], pad_token=specials[0])
    if chat:
        hf.chat_template = CHAT
    return hf


def save_qwen(path: Path, conditional: bool = False, tied: bool = False, shard: str | None = None,
              eos: int | None = None, seed: int = 0) -> Path:
    """A Qwen3_5ForCausalLM (or Qwen3_5ForConditionalGeneration, with a vision tower) directory with a chat tokenizer;
    ``eos``: generation_config.json's eos_token_id."""
    import transformers

    text = QWEN.to_hf()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if conditional:
            vision = transformers.Qwen3_5VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                      out_hidden_size=64, patch_size=4, spatial_merge_size=2,
                                                      temporal_patch_size=2)  # fmt: skip
            cfg = transformers.Qwen3_5Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                             tie_word_embeddings=tied)  # fmt: skip
            model = transformers.Qwen3_5ForConditionalGeneration(cfg)
        else:
            text.tie_word_embeddings = tied
            model = transformers.Qwen3_5ForCausalLM(text)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat=True).save_pretrained(path)
    return path


def save_whisper(path: Path, seed: int = 0) -> Path:
    """A WhisperForConditionalGeneration directory (tiny: 24 encoder tokens from 48 mel frames, 16 mel bins) with a
    tokenizer whose special tokens are the generation config's start, language, task, no-timestamps and
    start-of-previous-text tokens."""
    import transformers

    from models.whisper.config import WhisperConfig

    ours = WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                         encoder_ffn_dim=128, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128,
                         max_source_positions=24, max_target_positions=64, decoder_start_token_id=1, pad_token_id=0,
                         bos_token_id=0, eos_token_id=0, init_std=0.3)  # fmt: skip
    # (init_std 0.3: at transformers' 0.02 this small decoder repeats one token whatever it hears)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.WhisperForConditionalGeneration(ours.to_hf())
    model.save_pretrained(path)
    ids = {t: i for i, t in enumerate(WHISPER_SPECIALS)}
    gen = dict(decoder_start_token_id=1, eos_token_id=0, pad_token_id=0, no_timestamps_token_id=ids["<|notimestamps|>"],
               lang_to_id={"<|en|>": ids["<|en|>"], "<|de|>": ids["<|de|>"]},
               task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
               prev_sot_token_id=ids["<|startofprev|>"], is_multilingual=True)  # fmt: skip
    (path / "generation_config.json").write_text(json.dumps(gen))
    transformers.WhisperFeatureExtractor(feature_size=16).save_pretrained(path)
    tokenizer(WHISPER_SPECIALS, chat=False).save_pretrained(path)
    return path


def tone(seconds: float, hz: float = 440.0):
    """A 16 kHz sine wave with a little noise, float32."""
    import numpy as np

    t = np.arange(int(seconds * 16_000)) / 16_000
    rng = np.random.default_rng(0)
    return (0.5 * np.sin(2 * np.pi * hz * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def write_wav(path: Path, samples, rate: int = 16_000) -> Path:
    """16-bit mono PCM."""
    import wave

    import numpy as np

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return path
