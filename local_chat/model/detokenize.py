"""Turning generated token ids into answer text: incrementally, without U+FFFD, holding back stop-string prefixes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Appends one token at a time and returns the text it adds, decoding only a short window of ids.

    Decoding the window twice (with and without the new token) and keeping the difference gives the right
    spaces for sentencepiece (which drops a leading space at the start of a decode) and byte-level tokenizers.
    A character split over several byte tokens is held until it is complete, so U+FFFD never shows.
    The accumulated `text` equals `decode(all ids)`.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: context for the leading space of the next piece
        self._read_offset = 0  # ids before this are already part of `text`
        self.text = ""

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        window = self._ids[self._prefix_offset :]
        before = self._decode(window[: self._read_offset - self._prefix_offset])
        after = self._decode(window)
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new yet, or a multi-byte character still incomplete
        delta = after[len(before) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += delta
        return delta


class StopCutter:
    """A text that grows piece by piece, cut at its first stop string: `add` gives what a piece makes showable (a
    tail that could still become a stop string is held back until it is completed or ruled out), `finish` the tail
    held back at the end, and `hit` says whether a stop string came (nothing is shown after it)."""

    def __init__(self, stop_strings: Iterable[str]):
        self._stops = StopStrings(stop_strings)
        self.text, self.shown, self.hit = "", 0, False

    def add(self, piece: str) -> str:
        if self.hit:
            return ""
        self.text += piece
        found = self._stops.find(self.text)
        self.hit = found >= 0
        return self._show(found if self.hit else self._stops.safe_length(self.text))

    def finish(self) -> str:
        return "" if self.hit else self._show(len(self.text))

    def _show(self, end: int) -> str:
        new = self.text[self.shown : end]
        self.shown = max(self.shown, end)
        return new


class StopStrings:
    """Finds the first stop string in a growing text and how much of the text is safe to show.

    A tail that could still become a stop string is held back until it is completed or ruled out.
    """

    def __init__(self, stop_strings: Iterable[str]):
        self.stops = tuple(s for s in dict.fromkeys(stop_strings) if s)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._scanned = 0  # a match cannot start before this position of the text any more

    def find(self, text: str) -> int:
        """Index of the first full stop-string match in `text`, or -1; `text` only grows between calls."""
        start = max(0, self._scanned - self._longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self._scanned = len(text)
        return min(hits, default=-1)

    def safe_length(self, text: str) -> int:
        """Length of the longest prefix of `text` that cannot be the start of a stop string."""
        for start in range(max(0, len(text) - self._longest + 1), len(text)):
            tail = text[start:]
            if any(s.startswith(tail) for s in self.stops):
                return start
        return len(text)
