"""One choice's text as its tokens arrive: detokenized incrementally (never a part of a character), cut at the first
stop string (the stop string itself is not returned), and, while streaming, the text that could still be the start
of a stop string held back until the next token says whether it is."""

from __future__ import annotations

from models.engine.text import Detokenizer, Tokenizer


class ChoiceText:
    """``push(token)`` returns the text safe to send now and whether a stop string ended the choice; ``flush()`` the
    rest once the engine finished it. The pieces concatenate to the decoded tokens, cut before the first stop
    string."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.detok: Detokenizer = tokenizer.detokenizer()
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1  # a stop string's proper prefixes are this long at most
        self.text = ""  # everything decoded so far (up to the stop string, once one matched)
        self.sent = 0  # characters of ``text`` returned
        self.searched = 0  # characters of ``text`` no stop string can start before, except within ``hold`` of it
        self.stopped = False
        self.tokens = 0  # tokens pushed (up to the one that completed the stop string)

    def push(self, token: int) -> str:
        self.tokens += 1
        self.text += self.detok.push(token)
        if not self.stops:
            return self._release(len(self.text))
        if self._cut():
            return self._release(len(self.text))
        return self._release(max(self.sent, len(self.text) - self.hold))

    def flush(self) -> str:
        """What is left once the engine has finished the choice (the detokenizer's held-back text included)."""
        if not self.stopped:
            self.text += self.detok.flush()
            if self.stops:
                self._cut()
        return self._release(len(self.text))

    def _cut(self) -> bool:
        """Cut ``text`` at the first stop string that begins in the unsearched part; whether one did."""
        start = max(0, self.searched - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        self.searched = len(self.text)
        if not hits:
            return False
        self.text, self.stopped = self.text[: min(hits)], True
        return True

    def _release(self, upto: int) -> str:
        out, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        return out
