"""One choice's text as its tokens arrive: detokenized incrementally (never a part of a character), cut at the first
stop string (the stop string itself is not returned), and, while streaming, the text that could still be the start
of a stop string held back until the next token says whether it is."""

from __future__ import annotations

from models.engine.text import Detokenizer, Tokenizer


class ChoiceText:
    """``push(token)`` returns the text safe to send now; ``flush()`` the rest once the engine finished the choice;
    ``stopped`` says a stop string ended it. The pieces concatenate to the decoded tokens, cut before the first stop
    string. A push costs the length of its piece and the longest stop string, not of the text so far."""

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.detok: Detokenizer = tokenizer.detokenizer()
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1  # a stop string's proper prefixes are this long at most
        self.released: list[str] = []  # the pieces returned so far
        self.held = ""  # decoded, not yet returned: the last ``hold`` characters at most
        self.window = ""  # the last ``hold`` characters decoded (released or held): where a stop string may begin
        self.length = 0  # characters decoded so far (up to the stop string, once one matched)
        self.stopped = False
        self.tokens = 0  # tokens pushed (up to the one that completed the stop string)

    @property
    def text(self) -> str:
        """Everything decoded so far (up to the stop string, once one matched)."""
        return "".join(self.released) + self.held

    def push(self, token: int) -> str:
        self.tokens += 1
        piece = self.detok.push(token)
        if not self.stops:
            self.length += len(piece)
            if piece:
                self.released.append(piece)
            return piece
        return self._take(piece, hold=self.hold)

    def flush(self) -> str:
        """What is left once the engine has finished the choice (the detokenizer's held-back text included)."""
        if self.stopped:
            return ""
        return self._take(self.detok.flush(), hold=0)

    def _take(self, piece: str, hold: int) -> str:
        """``piece`` appended, cut at the first stop string that ends in it; returns what may be released while the
        last ``hold`` characters stay held."""
        s = self.window + piece  # every stop string that could end in ``piece`` begins in here
        start = len(self.window) - len(self.held)  # where the held text begins in ``s``
        hits = [i for i in (s.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            cut = min(hits)
            self.stopped, hold = True, 0
            s = s[:cut]
        self.length += len(s) - len(self.window)
        upto = max(start, len(s) - hold)
        out, self.held = s[start:upto], s[upto:]
        self.window = s[-self.hold :] if self.hold else ""
        if out:
            self.released.append(out)
        return out
