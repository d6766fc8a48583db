"""Text in and out: a checkpoint's tokenizer (transformers' ``AutoTokenizer`` over its ``tokenizer.json`` and
``tokenizer_config.json``, local files only), prompts as text or as chat messages through the checkpoint's chat
template, and incremental detokenization that never splits a character.

Streaming: a byte-level tokenizer spreads one character over several tokens (an emoji over three or four), and
decoding a token alone gives U+FFFD. ``Detokenizer.push`` decodes a short window that ends at the newest token and
holds text back while that window ends in an incomplete character, so the pieces it returns concatenate to the
decoding of all tokens at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers before 0.21
    DecodeStream = None

REPLACEMENT = "\ufffd"  # what a decoder gives for an incomplete UTF-8 sequence


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character standing for each byte, to the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


class TokenizerError(ValueError):
    """A model directory whose tokenizer cannot be used; the message names the file or what is missing."""


class Tokenizer:
    """Text and chat messages to prompt ids, ids back to text (``decode``, or streamed with ``detokenizer``)."""

    def __init__(self, hf) -> None:
        self.hf = hf  # a transformers tokenizer
        self._byte_of: dict[str, int] | None = None  # a byte-level vocabulary's characters to bytes, once asked

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
            raise TokenizerError(f"{path}: no tokenizer.json or tokenizer_config.json (the model directory's "
                                 "tokenizer)")  # fmt: skip
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(path, local_files_only=True))
        except Exception as e:  # transformers' own checks: a broken tokenizer.json, an unknown class
            raise TokenizerError(f"{path}: transformers cannot load its tokenizer: {e}") from None

    def encode(self, text: str) -> list[int]:
        """A prompt's ids, with the special tokens the tokenizer adds to a text (as transformers' pipelines do)."""
        return list(self.hf(text)["input_ids"])

    def encode_many(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        """Each text's ids as ``encode`` gives them (``special`` False: no special tokens added, as for a rendered
        chat), in one call: a fast tokenizer encodes a batch on its own threads, letting the interpreter go."""
        return [list(ids) for ids in self.hf(list(texts), add_special_tokens=special)["input_ids"]]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat(self, messages: Sequence[dict]) -> list[int]:
        """Chat messages ({"role", "content"} each) through the checkpoint's chat template, ready for the reply."""
        return self.encode_many([self.chat_text(messages)], special=False)[0]

    def chat_text(self, messages: Sequence[dict]) -> str:
        """The chat template's text for the messages, ready for the reply; its ids are ``encode_many`` of it with
        ``special`` False (what transformers' ``apply_chat_template`` does when it tokenizes)."""
        if not self.has_chat_template:
            raise TokenizerError("the checkpoint has no chat template (chat_template in tokenizer_config.json, or "
                                 "chat_template.jinja): give the prompt as text")  # fmt: skip
        return self.hf.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def piece(self, token: int) -> str:
        """One token's own text, special tokens included (a part of a character decodes as U+FFFD)."""
        return self.hf.decode([int(token)], skip_special_tokens=False)

    def piece_bytes(self, token: int) -> bytes:
        """One token's own bytes: a byte-level tokenizer's raw bytes (a part of a character is its bytes, not U+FFFD),
        else the UTF-8 of its text."""
        if self._byte_of is None:
            decoder = getattr(getattr(self.hf, "backend_tokenizer", None), "decoder", None)
            self._byte_of = _byte_decoder() if type(decoder).__name__ == "ByteLevel" else {}
        raw = self.hf.convert_ids_to_tokens(int(token))
        if self._byte_of and raw is not None and all(ch in self._byte_of for ch in raw):
            return bytes(self._byte_of[ch] for ch in raw)
        return self.piece(token).encode()

    def detokenizer(self) -> Detokenizer | StreamDetokenizer:
        """One request's streamed text: the tokenizers library's incremental decoder (Rust, a step a token) for a
        fast tokenizer, else the window decoder."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is not None and DecodeStream is not None:
            return StreamDetokenizer(self, backend)
        return Detokenizer(self)


class Detokenizer:
    """One request's streamed text: ``push(token)`` returns the text it completes (maybe ""), never a part of a
    character; the pieces concatenate to ``Tokenizer.decode`` of all the tokens."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] is the window whose text has been returned (context for the next piece)
        self.read = 0

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        done = self.tok.decode(self.ids[self.prefix : self.read])
        text = self.tok.decode(self.ids[self.prefix :])
        if text.endswith(REPLACEMENT) or len(text) <= len(done):
            return ""  # an incomplete character (or a token with no text of its own): wait for the next token
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(done) :]

    def flush(self) -> str:
        """The text held back at the end of the output (an incomplete last character decodes as U+FFFD)."""
        done = self.tok.decode(self.ids[self.prefix : self.read])
        text = self.tok.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(done) :]


class StreamDetokenizer:
    """``Detokenizer``'s contract on the tokenizers library's ``DecodeStream``: ``push`` returns the text a token
    completes (a step in Rust, not two decodes of a window); ``flush`` what an incomplete last character leaves,
    from one decode of all the tokens, made only when a token's text is still held (a stream whose last token came
    out whole has nothing left: a decode of a 256-token reply costs 35-50 us)."""

    def __init__(self, tokenizer: Tokenizer, backend) -> None:
        self.tok, self.backend = tokenizer, backend
        self.stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.sent = 0  # characters returned
        self.held = 0  # tokens pushed since the last piece (an incomplete character, or tokens of no text)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        piece = self.stream.step(self.backend, int(token))
        if not piece:
            self.held += 1
            return ""
        self.held = 0
        self.sent += len(piece)
        return piece

    def flush(self) -> str:
        if not self.held:
            return ""
        self.held = 0
        rest = self.tok.decode(self.ids)[self.sent :]
        self.sent += len(rest)
        return rest
