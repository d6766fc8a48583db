"""Write a Hugging Face directory of a Qwen3.5 model with random weights, for benchmarking what a real checkpoint costs
(loading, serving through HTTP) where no real one is at hand:

    python -m models.bench.make_checkpoint --model qwen3_5-0.8b --out /tmp/qwen3_5-0.8b

config.json and safetensors as transformers' ``save_pretrained`` writes them (Qwen3_5ForCausalLM, bf16 by default),
generation_config.json, and a word-level tokenizer over the model's whole vocabulary ("w6", "w7", ...; ids 0-2 the
chat template's special tokens, 3-5 its roles) with a chat template, so every id the model samples decodes to text
and the server's detokenizer does as much work a token as with a real vocabulary."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from models.cli import OneLineParser

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ROLES = ["system", "user", "assistant"]  # plain words of the vocabulary, after the specials
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip


def parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m models.bench.make_checkpoint", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", default="qwen3_5-0.8b", help="a Qwen3.5 shape of models.engine.adapters (default "
                                                             "qwen3_5-0.8b)")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="the directory to write (made if absent)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                    help="the weights' dtype (default bfloat16)")
    ap.add_argument("--seed", type=int, default=0, help="the weights' random seed (default 0)")
    return ap


def word_tokenizer(vocab_size: int):
    """A transformers fast tokenizer with one word per id: the specials, the chat roles, then "w6" .. "w{V - 1}"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + ROLES)}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[0],
                                 additional_special_tokens=SPECIALS[1:])  # fmt: skip
    hf.chat_template = CHAT
    return hf


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import transformers

    from models.engine.adapters import MODEL_CONFIGS

    if args.model not in MODEL_CONFIGS or not args.model.startswith("qwen3_5"):
        parser().error(f"argument --model: {args.model!r} is not a Qwen3.5 shape; known: "
                       f"{', '.join(m for m in MODEL_CONFIGS if m.startswith('qwen3_5'))}")  # fmt: skip
    t0 = time.perf_counter()
    cfg = MODEL_CONFIGS[args.model].to_hf()
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.Qwen3_5ForCausalLM(cfg).to(getattr(torch, args.dtype))
    model.generation_config.eos_token_id = 0
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    word_tokenizer(cfg.vocab_size).save_pretrained(args.out)
    (args.out / "resplan_checkpoint.json").write_text(json.dumps({"model": args.model, "seed": args.seed}))
    print(f"{args.out}: {args.model}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters in "
          f"{args.dtype}, {time.perf_counter() - t0:.1f} s", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
