"""Prompts to ids off the server's loop: the texts the requests of one turn of the loop ask for go to the tokenizer in
one call (``Tokenizer.encode_many``), made in a worker thread while the loop goes on streaming.

A byte-level BPE tokenizer takes ~0.8 ms for a prompt of 700 tokens of source code on the development CPU; a burst of
128 such prompts tokenized one by one on the loop held every stream's next chunk for ~100 ms. A fast tokenizer encodes
a batch on its own threads (one a core) and lets the interpreter go meanwhile, so the loop keeps writing chunks and
taking requests while a batch is encoded, and a burst's prompts are encoded side by side.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from models.engine.text import Tokenizer


class TokenizerQueue:
    """``await encode(texts)``: the texts' ids, as ``Tokenizer.encode_many`` gives them. Callers of one turn of the
    loop share a call into the tokenizer (``batches`` counts the calls); a caller cancelled meanwhile is skipped, and
    a text the tokenizer fails on fails its own caller only (the batch is encoded again caller by caller)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._waiting: list[tuple[list[str], bool, asyncio.Future]] = []  # (texts, special, the caller's future)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
        self.batches = 0

    async def encode(self, texts: list[str], special: bool = True) -> list[list[int]]:
        """Each text's ids (``special`` False: no special tokens added, as for a chat template's text)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if not self._waiting:  # the first caller of this turn: the batch goes once the turn's other callers are in
            loop.call_soon(self._flush, loop)
        self._waiting.append((texts, special, done))
        return await done

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._waiting = self._waiting, []
        self.batches += 1
        work = loop.run_in_executor(self._worker, self._encode, batch)
        work.add_done_callback(lambda w: self._deliver(batch, w))

    def _encode(self, batch: list[tuple[list[str], bool, asyncio.Future]]) -> list[list[list[int]] | Exception]:
        """(In the worker.) Each caller's ids, or the exception its texts raised: one encode_many a kind of
        ``special`` asked for, and where that raises, one a caller of that kind."""
        out: list[list[list[int]] | Exception | None] = [None] * len(batch)
        for special in (True, False):
            mine = [i for i, (_, s, _) in enumerate(batch) if s is special]
            if not mine:
                continue
            try:
                ids = self.tokenizer.encode_many([t for i in mine for t in batch[i][0]], special)
            except Exception:  # noqa: BLE001 (whose text it was: each caller alone)
                for i in mine:
                    try:
                        out[i] = self.tokenizer.encode_many(batch[i][0], special)
                    except Exception as e:  # noqa: BLE001 (its caller's to raise)
                        out[i] = e
                continue
            at = 0
            for i in mine:
                n = len(batch[i][0])
                out[i], at = ids[at : at + n], at + n
        return out

    @staticmethod
    def _deliver(batch: list[tuple[list[str], bool, asyncio.Future]], work: asyncio.Future) -> None:
        error = work.exception() if not work.cancelled() else asyncio.CancelledError()  # (the worker itself failed)
        for i, (_, _, done) in enumerate(batch):
            if done.done():  # (its caller was cancelled meanwhile)
                continue
            got = error if error is not None else work.result()[i]
            if isinstance(got, BaseException):
                done.set_exception(got)
            else:
                done.set_result(got)
