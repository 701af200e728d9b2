"""Device-synchronized clocks and a streamer that timestamps every generated token.

On a GPU the clock records CUDA/HIP events on the current stream, so intervals are device time
between two points of the stream, unaffected by host scheduling; reading them synchronizes once
at the end. On the CPU it is `time.perf_counter`.

`TokenTimer` is a transformers streamer: `generate()` calls `put()` with the prompt first, then
with each new token (after copying it to the host, i.e. after the step finished). So the second
mark is the first token (time to first token) and later marks give per-token decode latencies,
splitting prefill from decode in a single `generate()` call.
"""

from __future__ import annotations

import time
from typing import Any


class Clock:
    """Marks points in time on one device; `seconds(a, b)` is the interval between two marks."""

    def __init__(self, device: str) -> None:
        import torch

        self._torch = torch
        self.device = device
        self.uses_events = device.startswith("cuda")

    def synchronize(self) -> None:
        """Wait for the device to finish queued work (no-op on the CPU)."""
        if self.uses_events:
            self._torch.cuda.synchronize()

    def mark(self) -> Any:
        """A point in time: a recorded event on a GPU, a perf_counter reading on the CPU."""
        if self.uses_events:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from mark `start` to mark `end` (synchronizes on `end` when they are events)."""
        if self.uses_events:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start


def make_token_timer(clock: Clock):
    """A fresh streamer (a transformers `BaseStreamer`) that marks `clock` at every `put()`."""
    from transformers.generation.streamers import BaseStreamer

    class TokenTimer(BaseStreamer):
        """Collects one clock mark per `put()`; the first put is the prompt itself."""

        def __init__(self) -> None:
            self.marks: list[Any] = []
            self.puts = 0
            self.ended = False

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts == 1:
                return
            self.marks.append(clock.mark())

        def end(self) -> None:
            self.ended = True

    return TokenTimer()


def split_timings(clock: Clock, start: Any, token_marks: list[Any], end: Any) -> dict[str, Any]:
    """Turn the marks of one generate() call into TTFT, per-token decode latencies and end-to-end.

    `token_marks[0]` is when the first new token existed; each later mark is one decode step.
    """
    if not token_marks:
        raise RuntimeError("generate() produced no tokens through the streamer; cannot time prefill and decode.")
    ttft = clock.seconds(start, token_marks[0])
    itl = [clock.seconds(a, b) for a, b in zip(token_marks, token_marks[1:])]
    e2e = clock.seconds(start, end)
    return {"ttft_s": ttft, "itl_s": itl, "e2e_s": e2e}
