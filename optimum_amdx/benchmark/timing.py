"""GPU timing for every benchmark, device-synchronized clocks, and a token-timestamping streamer.

Kernel timing (`call_seconds`, `device_ms`, `graph_ms`, `l2_cold_copies`): warm up, time with
device events (the host clock on the CPU), report the median; `graph_ms` replays calls captured in
one CUDA/HIP graph so launch overhead is gone, and benchmarks pass it calls over enough distinct
copies of the data (`l2_cold_copies`) that each call reads from memory, not from a warm
L2/Infinity Cache. Every benchmark script times through these, so all figures share one method.

On a GPU the clock records CUDA/HIP events on the current stream, so intervals are device time
between two points of the stream, unaffected by host scheduling; reading them synchronizes once
at the end. On the CPU it is `time.perf_counter`.

`TokenTimer` is a transformers streamer: `generate()` calls `put()` with the prompt first, then
with each new token (after copying it to the host, i.e. after the step finished). So the second
mark is the first token (time to first token) and later marks give per-token decode latencies,
splitting prefill from decode in a single `generate()` call.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional, Sequence

L2_DEFEAT_BYTES = 400 << 20
"""Bytes of distinct data a graph of calls rotates through: several times any current GPU's
L2 / Infinity Cache (H100 50 MB, H200 60 MB, MI300X 256 MB)."""


WARMUP_SECONDS = 0.05
"""On a GPU, `call_seconds` keeps calling past its `warmup` count until this much time has passed. Without it the
first reading on a freshly made large weight was up to 15 % slow (H100, a 117 MB weight: 57 against 50 us per call,
RESULTS.md round26): three warm-up calls, 0.5 ms of work, did not cover the transient."""


def call_seconds(fn: Callable[[], Any], device: str = "cuda", reps: int = 25, warmup: int = 3,
                 calls_per_mark: int = 1) -> float:
    """Median seconds of one call of `fn` after `warmup` calls (on a GPU, and at least `WARMUP_SECONDS` of
    them), over `reps` samples.

    A sample is the interval between two clock marks (`Clock`: device events on a GPU, the host clock
    on the CPU) around `calls_per_mark` back-to-back calls, divided by that count: 1 times each call
    alone (its latency, launch included); more lets consecutive calls overlap as they do in a loop.
    """
    clock = Clock(device)
    for _ in range(warmup):
        fn()
    clock.synchronize()
    if clock.on_gpu and warmup:
        until = time.perf_counter() + WARMUP_SECONDS
        while time.perf_counter() < until:
            fn()
            clock.synchronize()
    times = []
    for _ in range(reps):
        start = clock.mark()
        for _ in range(calls_per_mark):
            fn()
        times.append(clock.seconds(start, clock.mark()) / calls_per_mark)
    return statistics.median(times)


def device_ms(fn: Callable[[], Any], reps: int = 25, warmup: int = 3) -> float:
    """Median device-event milliseconds of one call of `fn` after `warmup` calls (a GPU is required)."""
    return call_seconds(fn, "cuda", reps=reps, warmup=warmup) * 1e3


def graph_ms(calls: Sequence[Callable[[], Any]], reps: int = 20, warmup_calls: Optional[int] = None) -> float:
    """Median milliseconds per call when all `calls` are replayed from one captured graph.

    The first `warmup_calls` calls (None: all of them) run once on a side stream first: compilation, lazy
    workspaces, and any per-object state a call makes on its first use, which would otherwise be captured and
    recomputed on every replay. Warming only the first two calls once made every later weight copy's act-order call
    carry its index build in the graph (RESULTS.md round24; the weight now makes that index with itself,
    `W4A16Weight.x_order`).
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls[:warmup_calls]:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    ms = device_ms(graph.replay, reps=reps) / len(calls)
    del graph
    return ms


def l2_cold_copies(nbytes_per_call: int, budget: int = L2_DEFEAT_BYTES) -> int:
    """How many distinct copies of a call's data a graph should rotate through (at least 2)."""
    return max(2, budget // max(1, nbytes_per_call))


class Clock:
    """Marks points in time on one device; `seconds(a, b)` is the interval between two marks."""

    def __init__(self, device: str, host_marks: bool = False) -> None:
        """host_marks: mark host time (perf_counter) even on a GPU. Token timing needs it: a device event
        recorded when the host receives a token sits in the stream behind whatever the runtime has
        already queued (an engine that launches step n+1 before reading step n's token), so it would
        fire later than the token reached the user, and intervals would shift by one step."""
        import torch

        self._torch = torch
        self.device = device
        self.on_gpu = device.startswith("cuda")
        self.uses_events = self.on_gpu and not host_marks

    def synchronize(self) -> None:
        """Wait for the device to finish queued work (no-op on the CPU)."""
        if self.on_gpu:
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
