"""Generate text from a Hugging Face model directory: a Qwen3.5 checkpoint continues a prompt (or answers a chat
message), a Whisper checkpoint transcribes a WAV file. One prompt streams its text to the terminal as it is made;
several (``-n FILE``, one a line) run together and each is printed when it finishes.

    python -m models.generate --model-dir DIR --prompt "The capital of France is"
    python -m models.generate --model-dir DIR --chat --prompt "Write a haiku about paging."
    python -m models.generate --model-dir DIR -n prompts.txt --temperature 0.7 --top-p 0.9
    python -m models.generate --model-dir WHISPER_DIR --audio speech.wav --language en

The directory holds config.json, safetensors weights (one file, or shards with model.safetensors.index.json), the
tokenizer (tokenizer.json, tokenizer_config.json) and, optionally, generation_config.json (its EOS tokens end every
request unless --ignore-eos) and, for Whisper, processor_config.json or preprocessor_config.json. Nothing is
downloaded. The generated text goes to stdout; progress (loading, building, generating), a summary and errors to
stderr. Ctrl-C ends the command (exit status 130).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import attrs
import torch

from models.cli import OneLineParser, int32, positive_int, temperature, token_budget, top_k, top_p
from models.engine import (
    BESIDE_TOKEN_BUDGET,
    IN_STEP_TOKEN_BUDGET,
    Engine,
    InvalidRequest,
    PrefillPlacement,
    Request,
    SamplingParams,
)
from models.engine.audio import (
    SAMPLE_RATE,
    AudioError,
    decoder_prompt,
    detected,
    detection_prompt,
    feature_extractor,
    languages,
    log_mel,
    previous_ids,
    read_wav,
    windows,
)
from models.engine.checkpoint import WHISPER, CheckpointError, load_adapter, read_checkpoint
from models.engine.requests import CANDIDATES, MAX_LOGPROBS
from models.engine.serving import serving_config
from models.engine.text import Tokenizer, TokenizerError
from models.layers.decode_attention import Backend


def parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m models.generate", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model-dir", type=Path, required=True, help="a Hugging Face model directory (local files)")
    src = ap.add_argument_group("what to generate from (one of)")
    src.add_argument("--prompt", help="a text prompt (with --chat: the user's message)")
    src.add_argument("-n", "--prompts-file", type=Path, help="a file of prompts, one a line, run together")
    src.add_argument("--audio", type=Path, nargs="+",
                     help="PCM WAV files to transcribe, any rate (a Whisper checkpoint); one longer than the "
                          "encoder's window (30 s) is cut into windows at pauses, each printed with its span")
    ap.add_argument("--chat", action="store_true", help="send each prompt as a user message through the checkpoint's "
                                                        "chat template")  # fmt: skip
    ap.add_argument("--system", help="with --chat: a system message before each user message")
    s = ap.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=positive_int, default=128, help="new tokens at most, a request (default 128)")
    s.add_argument("--temperature", type=temperature, default=0.0, help="0 is greedy (default)")
    s.add_argument("--top-p", type=top_p, default=1.0, help="nucleus mass, in (0, 1] (default 1)")
    s.add_argument("--top-k", type=top_k, default=0, help=f"the k most likely tokens only, 0 = off, at most "
                                                          f"{CANDIDATES}")  # fmt: skip
    s.add_argument("--seed", type=int32, default=0, help="sampling seed, an int32 (a request's draws depend on it "
                                                         "alone)")  # fmt: skip
    s.add_argument("--ignore-eos", action="store_true", help="do not stop on the checkpoint's end-of-sequence tokens")
    w = ap.add_argument_group("Whisper")
    # (defaults None: a text checkpoint refuses these options only where they were given; Whisper's are resolved there)
    w.add_argument("--language", default=None,
                   help="spoken language of a multilingual checkpoint (default: detected on each file's first window)")
    w.add_argument("--task", default=None, choices=["transcribe", "translate"],
                   help="transcribe, or translate into English (default transcribe)")
    w.add_argument("--timestamps", action="store_true", help="let the model emit timestamp tokens")
    w.add_argument("--previous-text", default=None,
                   help="a text each window is conditioned on: earlier words, names' spellings (OpenAI's "
                        "transcription prompt; Whisper's <|startofprev|>; its last half-context of tokens kept)")
    e = ap.add_argument_group("engine")
    e.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda where there is one)")
    e.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="weights and KV caches (default: the checkpoint's)")
    e.add_argument("--attention", choices=[b.value for b in Backend], default=None,
                   help="decode attention (default: triton on CUDA for Qwen3.5, needing no host plan; torch "
                        "elsewhere; fa2 and xqa need CUDA and a Qwen3.5 checkpoint)")
    e.add_argument("--max-running", type=positive_int, default=8, help="requests run at once (default 8)")
    e.add_argument("--page-size", type=positive_int, default=16, help="tokens a KV page holds (default 16)")
    e.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="context a request may fill (default: the longest prompt plus --max-tokens)")
    e.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="launch each decode step before reading the last one's tokens, as the benchmarks' fastest "
                        "arms do (default: on)")
    e.add_argument("--no-prefix-cache", action="store_true",
                   help="no prefix cache (by default on for Qwen3.5: KV pages shared by their token chain, "
                        "recurrent-state checkpoints restored, so prompts that share a prefix compute it once)")
    e.add_argument("--prefill-graphs", type=int, default=None,
                   help="token buckets of prefill CUDA graphs, halving down from 8192 tokens (default 6 where the "
                        "pass can be captured: a checkpoint in bf16 or fp16 on CUDA; else 0, eager prefill)")
    e.add_argument("--prefill", choices=[p.value for p in PrefillPlacement], default=None,
                   help="where a prefill pass runs: beside (on a CUDA stream of its own while the running requests "
                        "keep decoding), beside-priority (the same, the decode steps on a stream of higher priority), "
                        "in-step (inside its step), in-pass (the running requests' tokens ride in the pass); "
                        "default: beside on CUDA, in-step elsewhere")
    e.add_argument("--token-budget", type=token_budget, default="auto", metavar="auto|N",
                   help=f"prompt tokens prefilled a step: longer prompts prefill in chunks beside the running rows; "
                        f"auto (the default): the engine's, {BESIDE_TOKEN_BUDGET} where passes run beside the decode "
                        f"steps (CUDA), {IN_STEP_TOKEN_BUDGET} where they run in the step")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines and no summary on stderr (errors "
                                                               "and warnings only)")  # fmt: skip
    return ap


WHISPER_OPTIONS = (("language", "--language"), ("task", "--task"), ("timestamps", "--timestamps"),
                   ("previous_text", "--previous-text"))  # fmt: skip


def _device(ap, name: str | None) -> str:
    """The device --device names (default: cuda where there is one); one that is not here is refused in one line."""
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        ap.error(f"argument --device: {name!r}: cuda, cuda:N or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"argument --device: {name}: no CUDA GPU here (use --device cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        ap.error(f"argument --device: {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return name


class Progress:
    """Stage lines on stderr (``[ 2.1 s] building the engine ...``), each with the seconds since the command
    started; nothing with --quiet."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.t0 = quiet, time.perf_counter()

    def __call__(self, stage: str, notes: tuple[str, ...] = ()) -> None:
        """Say that ``stage`` starts now (and, a line each below it, ``notes`` on how it goes)."""
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:5.1f} s] {stage} ...", file=sys.stderr, flush=True)
            for note in notes:
                print(f"    {note}", file=sys.stderr, flush=True)


def _windows(name: str, wave, window: int) -> list[tuple[str, object]]:
    """A file's audio in the encoder's windows (``audio.windows``), each named: the file's name alone when it fits one,
    else with each window's span in seconds."""
    pieces = windows(wave, window)
    if len(pieces) == 1:
        return [(name, pieces[0][1])]
    return [(f"{name} {a / SAMPLE_RATE:.2f}-{(a + p.size) / SAMPLE_RATE:.2f} s", p) for a, p in pieces]


def _previous(args, ckpt, tok: Tokenizer) -> list[int]:
    """The ids of ``--previous-text`` a Whisper prompt is conditioned on (``audio.previous_ids``), none without it
    (or for a text checkpoint, which refuses the option)."""
    if ckpt.architecture != WHISPER or not args.previous_text:
        return []
    return previous_ids(tok, args.previous_text, ckpt.config.max_target_positions)


def _spoken_languages(engine: Engine, requests: list[Request], ckpt, args, progress: Progress,
                      previous: list[int]) -> list[Request]:  # fmt: skip
    """Each file's spoken language, detected on its first window as Whisper detects it (``audio.detected``: the most
    likely language token after the start token; en where the model names none), in its requests' prompts (after
    the ``previous`` text's ids, if any)."""
    gen, start = ckpt.generation, ckpt.config.decoder_start_token_id
    firsts: dict[str, Request] = {}  # a file's index -> its first window's request
    for r in requests:
        firsts.setdefault(r.request_id.split(":", 1)[0], r)
    probe = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=MAX_LOGPROBS)
    results = engine.run([Request(detection_prompt(gen, start), probe, features=r.features, request_id=f"language {i}")
                          for i, r in firsts.items()])  # fmt: skip
    found = {i: detected(res.top_logprobs[0], languages(gen)) for i, res in zip(firsts, results, strict=True)}
    progress("spoken language detected (no --language)",
             tuple(f"{args.audio[int(i)].name}: {code or 'en (the model names none)'}" for i, code in found.items()))
    return [attrs.evolve(r, prompt=decoder_prompt(gen, start, found[r.request_id.split(":", 1)[0]] or "en",
                                                  args.task or "transcribe", args.timestamps, previous))
            for r in requests]  # fmt: skip


def _requests(args, ap, ckpt, tok: Tokenizer, previous: list[int]) -> list[Request]:
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        seed=args.seed, ignore_eos=args.ignore_eos)  # fmt: skip
    if ckpt.architecture == WHISPER:
        if args.audio is None:
            ap.error(f"{ckpt.name} is a Whisper checkpoint: give --audio FILE.wav")
        if args.chat:
            ap.error(f"argument --chat: {ckpt.name} is a Whisper checkpoint: it transcribes --audio, it does not chat")
        cfg = ckpt.config
        fe = feature_extractor(ckpt.path, cfg.num_mel_bins)
        prompt = decoder_prompt(ckpt.generation, cfg.decoder_start_token_id, args.language or "en",
                                args.task or "transcribe", args.timestamps, previous)  # fmt: skip
        return [Request(prompt, sp, features=log_mel(piece, fe, cfg.n_frames), request_id=rid)
                for i, f in enumerate(args.audio) for rid, piece in _windows(f"{i}:{f.name}", read_wav(f),
                                                                             cfg.n_frames * fe.hop_length)]  # fmt: skip
    if args.audio is not None:
        ap.error(f"{ckpt.name} is a text model ({ckpt.architecture}): give --prompt or --prompts-file")
    given = [flag for dest, flag in WHISPER_OPTIONS if getattr(args, dest) not in (None, False)]
    if given:
        ap.error(f"argument {given[0]}: {ckpt.name} is a text model ({ckpt.architecture}); {given[0]} is for a "
                 "Whisper checkpoint's --audio")  # fmt: skip
    if args.prompt is not None:
        texts = [args.prompt]
    else:
        try:
            texts = [line for line in args.prompts_file.read_text().splitlines() if line.strip()]
        except OSError as e:
            ap.error(f"argument -n/--prompts-file: {args.prompts_file}: {e.strerror}")
        if not texts:
            ap.error(f"argument -n/--prompts-file: {args.prompts_file} has no prompts")
    out = []
    for i, text in enumerate(texts):
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": text}]  # fmt: skip
            ids = tok.chat(messages)
        else:
            ids = tok.encode(text)
        if not ids:
            ap.error(f"prompt {i}: the tokenizer gives no tokens for {text!r}")
        out.append(Request(ids, sp, request_id=str(i)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the command; 0 when every request finished, 130 on Ctrl-C (one line on stderr), 2 on an error."""
    ap = parser()
    args = ap.parse_args(argv)
    try:
        return _generate(args, ap, Progress(args.quiet))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _generate(args, ap, progress: Progress) -> int:
    """Check the arguments, load the checkpoint, build the engine and print what it generates."""
    given = [x for x in ("prompt", "prompts_file", "audio") if getattr(args, x) is not None]
    if len(given) != 1:
        ap.error("give one of --prompt, --prompts-file (-n) or --audio")
    if args.system is not None and not args.chat:
        ap.error("argument --system: only with --chat (the system message goes through the chat template)")
    if args.prefill_graphs is not None and args.prefill_graphs < 0:
        ap.error("argument --prefill-graphs: must be >= 0")
    device = _device(ap, args.device)
    progress(f"loading {args.model_dir}")
    try:
        ckpt = read_checkpoint(args.model_dir)
        tok = Tokenizer.from_pretrained(args.model_dir)
        previous = _previous(args, ckpt, tok)  # (a Whisper prompt's previous text: tokenized once)
        requests = _requests(args, ap, ckpt, tok, previous)
    except (CheckpointError, TokenizerError, AudioError) as e:
        ap.error(str(e))
    context = ckpt.config.max_target_positions if ckpt.architecture == WHISPER else ckpt.config.max_position_embeddings
    longest = max(len(r.prompt) for r in requests) + args.max_tokens
    if args.max_seq_len is not None and longest > args.max_seq_len:
        ap.error(f"argument --max-seq-len: a prompt of {longest - args.max_tokens} tokens and --max-tokens "
                 f"{args.max_tokens} do not fit {args.max_seq_len}")  # fmt: skip
    if longest > context:
        ap.error(f"a prompt of {longest - args.max_tokens} tokens and --max-tokens {args.max_tokens} are more than "
                 f"{ckpt.name}'s context of {context}")  # fmt: skip
    try:
        adapter = load_adapter(args.model_dir, device, getattr(torch, args.dtype) if args.dtype else None)
        plan = serving_config(adapter, device, max_running=min(args.max_running, len(requests)),
                              max_seq_len=args.max_seq_len or longest, page_size=args.page_size,
                              attention=None if args.attention is None else Backend(args.attention),
                              overlap=args.overlap, prefill_graphs=args.prefill_graphs,
                              prefill=None if args.prefill is None else PrefillPlacement(args.prefill),
                              token_budget=args.token_budget,
                              prefix_cache=False if args.no_prefix_cache else None)  # fmt: skip
        progress("building the engine (graphs, kernels)", plan.notes)
        engine = Engine(adapter, plan.config)
        if ckpt.architecture == WHISPER and args.language is None and languages(ckpt.generation):
            requests = _spoken_languages(engine, requests, ckpt, args, progress, previous)
        ids = [engine.submit(r) for r in requests]
    except (CheckpointError, InvalidRequest, ValueError) as e:
        ap.error(str(e))
    progress(f"generating ({len(ids)} request{'s' if len(ids) > 1 else ''})")
    stream = tok.detokenizer() if len(ids) == 1 else None  # one request: its text as it comes
    results = []
    t0 = time.perf_counter()
    streamed = False  # text on stdout that no newline ends yet
    try:
        while engine.has_work():
            out = engine.step()
            if stream is not None:
                text = "".join(stream.push(t) for t in out.tokens.tolist())
                sys.stdout.write(text)
                sys.stdout.flush()
                streamed = streamed or bool(text)
            for result in out.finished:
                results.append(result)
                if stream is None:
                    print(f"### [{result.request_id}] {result.finish_reason.value}, {len(result.tokens)} tokens")
                    print(tok.decode(result.tokens), flush=True)
    except KeyboardInterrupt:
        if streamed:  # end the streamed line: "interrupted" and the shell's prompt go on lines of their own
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    wall = time.perf_counter() - t0
    if stream is not None:
        (result,) = results
        sys.stdout.write(stream.flush() + "\n")
        summary = (f"[{result.finish_reason.value}, {len(result.tokens)} tokens, TTFT {result.ttft_s * 1e3:.0f} ms, "
                   f"{wall:.2f} s]")  # fmt: skip
    else:
        summary = f"[{len(requests)} requests, {sum(len(r.tokens) for r in results)} tokens, {wall:.2f} s]"
    if not args.quiet:
        print(summary, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
