"""`optimum-amdx serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.

Modules: `protocol` (request checks, response shapes), `detokenizer` (streaming text, stop strings),
`engine_loop` (the thread that steps `LLMEngine`), `metrics` (Prometheus), `app` (the Starlette
routes) and `server` (loading, uvicorn, graceful shutdown). Needs the `serve` extra
(starlette, uvicorn, prometheus_client); importing this package does not import them.
"""

from __future__ import annotations

from optimum_amdx._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "ServeConfig": "optimum_amdx.serving.server",
    "serve": "optimum_amdx.serving.server",
    "build_app": "optimum_amdx.serving.app",
    "EngineLoop": "optimum_amdx.serving.engine_loop",
}

REQUIRED_PACKAGES = ("starlette", "uvicorn", "prometheus_client")

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
