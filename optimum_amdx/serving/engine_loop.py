"""The one engine loop of the server: a thread that owns the `LLMEngine` and steps it.

HTTP handlers never touch the engine. They send commands (add, abort) through a thread-safe
queue; the loop applies every pending command before each step, so an abort frees the request's
KV blocks before the next batch runs. Each step's outputs are handed to the asyncio event loop in
one `call_soon_threadsafe` call and delivered to the per-request callbacks there. Requests from
all connections therefore share one continuous batch.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

from ..errors import AMDXError
from ..modeling.engine import LLMEngine
from ..modeling.sampling import SamplingParams

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
"""How long the idle loop sleeps on the command queue before looking at the stop flag again."""


@dataclass
class TokenEvent:
    """New tokens for one request; `error` set when the request failed (then it is over)."""

    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    error: str | None = None
    refused: bool = False  # the engine refused the request (a client error), rather than failing on it


Sink = Callable[[TokenEvent], None]


class EngineLoop:
    """Steps an LLMEngine on a dedicated thread; delivers tokens to callbacks on an asyncio loop."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._sinks: dict[Hashable, Sink] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self.num_steps = 0
        self.num_step_errors = 0
        self.last_error: str | None = None

    # ---- called from the event loop -------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the stepping thread; callbacks will run on `loop`."""
        self._loop = loop
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="amdx-engine-loop", daemon=True)
        self._thread.start()

    def submit(self, request_id: Hashable, prompt_ids: Sequence[int], params: SamplingParams,
               sink: Sink, seed: int | None = None) -> None:
        """Queue a request; `sink` gets its TokenEvents on the event loop."""
        self._commands.put(("add", (request_id, list(prompt_ids), params, sink, seed)))

    def abort(self, request_id: Hashable) -> None:
        """Drop a request: its blocks are freed before the next step."""
        self._commands.put(("abort", request_id))

    def stop(self, timeout: float = 30.0) -> None:
        """Abort whatever is left and end the thread."""
        self._stop.set()
        self._commands.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- read by /metrics (plain reads of ints and lengths, safe across threads) ------------------
    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    # ---- the thread ----------------------------------------------------------------------------
    def _deliver(self, events: list[tuple[Sink, TokenEvent]]) -> None:
        if events and self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(_dispatch, events)
            except RuntimeError:  # the event loop closed meanwhile: nobody is left to answer
                pass

    def _apply(self, kind: str, payload: Any, out: list[tuple[Sink, TokenEvent]]) -> None:
        if kind == "add":
            request_id, prompt_ids, params, sink, seed = payload
            try:
                self.engine.add_request(prompt_ids, params, request_id=request_id, seed=seed)
            except AMDXError as err:
                out.append((sink, TokenEvent([], True, None, error=str(err), refused=True)))
                return
            self._sinks[request_id] = sink
        elif kind == "abort":
            if self._sinks.pop(payload, None) is not None:
                self.engine.abort(payload)

    def _drain(self, block: bool, out: list[tuple[Sink, TokenEvent]]) -> None:
        try:
            kind, payload = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        self._apply(kind, payload, out)
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            self._apply(kind, payload, out)

    def _fail_all(self, message: str, out: list[tuple[Sink, TokenEvent]]) -> None:
        for request_id, sink in list(self._sinks.items()):
            self.engine.abort(request_id)
            out.append((sink, TokenEvent([], True, None, error=message)))
        self._sinks.clear()

    def _run(self) -> None:
        while True:
            out: list[tuple[Sink, TokenEvent]] = []
            self._drain(block=not self.engine.has_unfinished(), out=out)
            if self._stop.is_set():
                self._fail_all("The server is shutting down; the request was aborted.", out)
                self._deliver(out)
                return
            if self.engine.has_unfinished():
                try:
                    results = self.engine.step()
                    self.num_steps += 1
                except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the server
                    self.num_step_errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    logger.exception("Engine step failed; aborting the requests in flight.")
                    self._fail_all(f"The engine failed while generating: {self.last_error}", out)
                    results = []
                for res in results:
                    sink = self._sinks.get(res.request_id)
                    if sink is None:
                        continue
                    out.append((sink, TokenEvent(list(res.new_token_ids), res.finished, res.finish_reason)))
                    if res.finished:
                        del self._sinks[res.request_id]
                        self.engine.abort(res.request_id)  # forgets the finished request's record
            self._deliver(out)


def _dispatch(events: list[tuple[Sink, TokenEvent]]) -> None:
    for sink, event in events:
        try:
            sink(event)
        except Exception:  # noqa: BLE001 - one broken consumer must not starve the others
            logger.exception("Delivering tokens to a request failed.")
