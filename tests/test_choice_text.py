"""The server's per-choice text (``models.server.text.ChoiceText``) against the plain rule it keeps incrementally: the
pieces it returns concatenate to the decoded text cut before the first stop string, and while streaming it holds back
no more than the longest stop string could still need."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from models.server.text import ChoiceText


class _Pieces:
    """A detokenizer that returns the piece a token stands for (``flush``: a tail it held back)."""

    def __init__(self, pieces: list[str], tail: str) -> None:
        self.pieces, self.tail = pieces, tail

    def push(self, token: int) -> str:
        return self.pieces[token]

    def flush(self) -> str:
        return self.tail


class _Tokenizer:
    def __init__(self, pieces: list[str], tail: str) -> None:
        self.pieces, self.tail = pieces, tail

    def detokenizer(self) -> _Pieces:
        return _Pieces(self.pieces, self.tail)


_text = st.text(alphabet="abc", max_size=4)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_text, min_size=1, max_size=12), tail=_text,
       stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3))  # fmt: skip
def test_the_streamed_pieces_are_the_text_cut_at_the_first_stop_string(pieces, tail, stops):
    ct = ChoiceText(_Tokenizer(pieces, tail), stops)
    out, decoded = [], ""
    for i, p in enumerate(pieces):
        out.append(ct.push(i))
        decoded += p
        if ct.stopped:
            break
        hold = max((len(s) for s in stops), default=1) - 1
        assert len("".join(out)) >= len(decoded) - hold  # nothing held back that no stop string could start
        assert ct.length == len(decoded)
    if not ct.stopped:
        decoded += tail
    out.append(ct.flush())
    first = min((i for i in (decoded.find(s) for s in stops) if i >= 0), default=None)
    want = decoded if first is None else decoded[:first]
    assert "".join(out) == want == ct.text
    assert ct.stopped == (first is not None)
    assert ct.tokens == (len(out) - 1)
