"""Prometheus metrics of one server: queue, batch, KV pool, latency histograms and token counters.

Each server has its own registry (several servers in one process, as in tests, do not collide).
Gauges are read from the engine loop when scraped; histograms and counters are fed by the HTTP
handlers as requests finish.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from .engine_loop import EngineLoop

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """The metric objects; `render()` is the /metrics body."""

    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        engine = loop.engine
        Gauge("amdx_num_requests_waiting", "Requests queued, not yet in the running batch.",
              registry=reg).set_function(lambda: loop.num_waiting)
        Gauge("amdx_num_requests_running", "Sequences in the running batch.",
              registry=reg).set_function(lambda: loop.num_running)
        Gauge("amdx_kv_blocks_total", "KV cache blocks in the pool.", registry=reg).set_function(lambda: engine.num_blocks)
        Gauge("amdx_kv_blocks_free", "KV cache blocks not owned by any sequence.",
              registry=reg).set_function(lambda: engine.num_free_blocks)
        Gauge("amdx_kv_blocks_used", "KV cache blocks owned by sequences.",
              registry=reg).set_function(lambda: engine.num_blocks - engine.num_free_blocks)
        Gauge("amdx_num_preemptions", "Sequences preempted (recomputed later) since start.",
              registry=reg).set_function(lambda: engine.scheduler.num_preemptions)
        Gauge("amdx_engine_steps", "Engine steps run since start.", registry=reg).set_function(lambda: loop.num_steps)
        self.in_flight = Gauge("amdx_num_requests_in_flight", "Requests admitted by the HTTP layer, not yet answered.",
                               registry=reg)
        self.ttft = Histogram("amdx_time_to_first_token_seconds", "Time from request arrival to its first token.",
                              buckets=TTFT_BUCKETS, registry=reg)
        self.tpot = Histogram("amdx_time_per_output_token_seconds",
                              "Mean time between output tokens of a request (after the first).",
                              buckets=TPOT_BUCKETS, registry=reg)
        self.generation_tokens = Counter("amdx_generation_tokens", "Tokens generated.", registry=reg)
        self.prompt_tokens = Counter("amdx_prompt_tokens", "Prompt tokens of admitted requests.", registry=reg)
        self.requests = Counter("amdx_requests", "Requests answered, by outcome.", ["outcome"], registry=reg)
        Gauge("amdx_model_info", "The served model.", ["model"], registry=reg).labels(model=model_name).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
