"""Token ids to text, a few tokens at a time, with stop strings.

Decoding each new token alone loses the spaces and multi-byte characters that depend on its
neighbours, and decoding the whole output every step costs O(n^2). So text is decoded over a
short sliding window: the window starts a few tokens back (the last prompt tokens at first), and
the new text is the window's decoding minus the decoding of its already-emitted part. A window
that ends inside a UTF-8 character (decodes to U+FFFD) waits for the next token.

Stop strings end the answer at their first occurrence (the stop string itself is not returned,
as in the OpenAI API). While streaming, the last `len(longest stop) - 1` characters are held
back until it is clear they do not start a stop string.
"""

from __future__ import annotations

from typing import Any, Sequence

PROMPT_CONTEXT_TOKENS = 5
"""Prompt tokens the first window starts with, so the first output token decodes as it would after the prompt."""


class IncrementalDetokenizer:
    """Accumulates the generated text of one request; `add` returns the newly releasable text."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        tail = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._ids = tail
        self._prefix = 0
        self._read = len(tail)
        self.text = ""
        self._sent = 0
        self.stop = list(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.stopped = False

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _advance(self, final: bool) -> None:
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)

    def _find_stop(self, start: int) -> None:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def add(self, token_ids: Sequence[int], final: bool = False) -> str:
        """Take new token ids; returns text safe to send now (everything left when `final` or stopped)."""
        if self.stopped:
            return ""
        checked = len(self.text)
        self._ids.extend(int(t) for t in token_ids)
        self._advance(final)
        if self.stop:
            self._find_stop(max(0, checked - self._hold))
        end = len(self.text) if (final or self.stopped) else max(self._sent, len(self.text) - self._hold)
        out = self.text[self._sent:end]
        self._sent = end
        return out
