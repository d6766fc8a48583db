"""The server's tokenizer queue: the texts callers ask for in one turn of the loop go to the tokenizer in one call,
each caller gets its own texts' ids (as ``Tokenizer.encode`` gives them, or without special tokens), a caller
cancelled meanwhile leaves the others served, and a tokenizer's error reaches the callers whose texts raise it."""

from __future__ import annotations

import asyncio

import pytest
from checkpoints import tokenizer

from models.engine.text import Tokenizer
from models.server.tokenizer_queue import TokenizerQueue


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat=True).save_pretrained(d)
    return Tokenizer.from_pretrained(d)


def test_one_turns_callers_share_one_call_and_each_gets_its_own_ids(tok):
    texts = [f"the quick brown fox {i} " * (i + 1) for i in range(12)]

    async def run():
        q = TokenizerQueue(tok)
        try:
            got = await asyncio.gather(*(q.encode([t]) for t in texts), q.encode(texts[:3]),
                                       q.encode(["café 😀"], special=False))  # fmt: skip
            first = q.batches
            again = await q.encode([texts[0]])
            return got, first, again, q.batches
        finally:
            q.close()

    got, first, again, batches = asyncio.run(run())
    assert got[:12] == [[tok.encode(t)] for t in texts]
    assert got[12] == [tok.encode(t) for t in texts[:3]] and got[13] == tok.encode_many(["café 😀"], special=False)
    assert first == 1 and again == [tok.encode(texts[0])] and batches == 2


def test_a_text_the_tokenizer_fails_on_fails_its_own_caller_only(tok):
    class Picky:
        def encode_many(self, texts, special=True):
            if any("bad" in t for t in texts):
                raise ValueError("a bad text")
            return tok.encode_many(texts, special)

    async def run():
        q = TokenizerQueue(Picky())
        try:
            return await asyncio.gather(q.encode(["a b"]), q.encode(["c", "bad d"]), q.encode(["e f"], special=False),
                                        return_exceptions=True), q.batches  # fmt: skip
        finally:
            q.close()

    (a, bad, e), batches = asyncio.run(run())
    assert batches == 1 and a == [tok.encode("a b")] and e == tok.encode_many(["e f"], special=False)
    assert isinstance(bad, ValueError) and "a bad text" in str(bad)


def test_a_cancelled_caller_leaves_the_others_served_and_an_error_reaches_every_caller(tok):
    class Broken:
        def encode_many(self, texts, special=True):
            raise ValueError("no vocabulary")

    async def run():
        q = TokenizerQueue(tok)
        a, b = asyncio.ensure_future(q.encode(["a b"])), asyncio.ensure_future(q.encode(["c d"]))
        await asyncio.sleep(0)  # (both in the queue, the batch on its way)
        a.cancel()
        ids = await asyncio.wait_for(b, 30)  # (bounded: a batch that stops at the cancelled caller would hang)
        q.close()
        broken = TokenizerQueue(Broken())
        results = await asyncio.gather(broken.encode(["x"]), broken.encode(["y"]), return_exceptions=True)
        broken.close()
        return a.cancelled(), ids, results

    cancelled, ids, results = asyncio.run(run())
    assert cancelled and ids == [tok.encode("c d")]
    assert [type(r) for r in results] == [ValueError, ValueError] and "no vocabulary" in str(results[0])
