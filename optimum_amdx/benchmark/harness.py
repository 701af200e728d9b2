"""The measuring loop: prefill latency, decode latency, decode throughput and memory per point.

Method (as optimum-benchmark): per point, `warmup` untimed generate() calls (they also absorb
compilation and TunableOp tuning), then `repeats` timed calls on fresh seeded random prompts, each
timed on the host clock after a device synchronize at the start, with the prefill/decode split taken
from a token-timestamping streamer marking when the host receives each token (what a user sees; a
device event there would fire behind work an asynchronous engine already queued, see `timing.Clock`). Figures are medians and p90s over repeats. Every point carries its
roofline: the bytes a decode step must read over the memory bandwidth, and the prefill FLOPs over
the matmul rate.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..errors import InvalidArgumentError, UnsupportedModelError
from . import roofline
from .backends import BACKENDS, QUANTIZATIONS, LoadSizes, ModelSource, Runner, get_backend, resolve_source
from .schema import SCHEMA_ID, validate
from .stats import summarize

GPU_DEFAULT_BACKENDS = ("transformers", "transformers-compile", "rocm")
CPU_DEFAULT_BACKENDS = ("transformers",)


@dataclass
class BenchmarkSpec:
    """Everything a benchmark run varies. Lists are crossed: backend x dtype x quantization x batch x prompt x new."""

    model: str = "default"
    backends: list[str] | None = None
    dtypes: list[str] = field(default_factory=lambda: ["auto"])
    quantizations: list[str] = field(default_factory=lambda: ["none"])
    batch_sizes: list[int] | None = None
    prompt_lengths: list[int] | None = None
    new_tokens: list[int] | None = None
    warmup: int | None = None
    repeats: int | None = None
    seed: int = 0
    device: str | None = None
    gpu: str | None = None
    measure_ceilings: bool = False
    tunable_op: bool = False
    tunable_op_dir: str | None = None
    threads: int | None = None
    allow_pickle: bool = False
    """Allow a checkpoint folder whose weights exist only as .bin/.pt (runs pickle: trusted sources only)."""


def defaults_for(device: str) -> dict[str, Any]:
    """Sensible sizes: a short run on a CPU (batch 1, short prompt, few tokens), a sweep on a GPU."""
    if device.startswith("cuda"):
        return {"batch_sizes": [1, 8, 32], "prompt_lengths": [128], "new_tokens": [64], "warmup": 2, "repeats": 5}
    return {"batch_sizes": [1], "prompt_lengths": [32], "new_tokens": [16], "warmup": 1, "repeats": 3}


def _resolve_spec(spec: BenchmarkSpec, device: str) -> BenchmarkSpec:
    filled = BenchmarkSpec(**asdict(spec))
    filled.device = device
    for key, value in defaults_for(device).items():
        if getattr(filled, key) is None:
            setattr(filled, key, value)
    for name in ("batch_sizes", "prompt_lengths", "new_tokens"):
        values = getattr(filled, name)
        if not values or any(int(v) < 1 for v in values):
            raise InvalidArgumentError(f"--{name.replace('_', '-')} needs positive integers, got {values}.")
        setattr(filled, name, [int(v) for v in values])
    if min(filled.new_tokens) < 2:
        raise InvalidArgumentError("--new-tokens must be at least 2: decode latency needs a token after the first.")
    if filled.repeats < 1 or filled.warmup < 0:
        raise InvalidArgumentError(f"--repeats must be >= 1 and --warmup >= 0 (got {filled.repeats}, {filled.warmup}).")
    for q in filled.quantizations:
        if q not in QUANTIZATIONS:
            raise InvalidArgumentError(f"Unknown quantization {q!r}; use one of {', '.join(QUANTIZATIONS)}.")
    return filled


def backend_table(device: str) -> dict[str, dict[str, Any]]:
    """Availability of every known backend on `device`, with the reason when unavailable."""
    table = {}
    for name, backend in BACKENDS.items():
        ok, reason = backend.availability(device)
        table[name] = {"available": ok, "reason": reason or None, "summary": backend.summary}
    return table


def choose_backends(requested: list[str] | None, table: dict[str, dict[str, Any]], device: str) -> list[str]:
    """Explicitly named backends must be available; the default is whichever of the usual ones are."""
    if requested:
        names = [get_backend(n).name for n in requested]
        missing = [n for n in names if not table[n]["available"]]
        if missing:
            details = "; ".join(f"{n}: {table[n]['reason']}" for n in missing)
            raise InvalidArgumentError(f"Backend(s) {', '.join(missing)} unavailable here ({details}). "
                                       "Install what is missing or leave them out of --backends.")
        return names
    pool = GPU_DEFAULT_BACKENDS if device.startswith("cuda") else CPU_DEFAULT_BACKENDS
    return [n for n in pool if table[n]["available"]]


def _prompt(torch: Any, generator: Any, vocab: int, batch: int, length: int, device: str) -> tuple[Any, Any]:
    low = min(100, vocab // 4)
    ids = torch.randint(low, vocab, (batch, length), generator=generator).to(device)
    return ids, torch.ones_like(ids)


def measure_point(
    runner: Runner,
    device: str,
    vocab: int,
    batch: int,
    prompt_length: int,
    new_tokens: int,
    warmup: int,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    """Warm up, then time `repeats` generate() calls; return the per-point summaries."""
    import torch

    from .ceilings import peak_rss_bytes
    from .timing import Clock, make_token_timer, split_timings

    clock = Clock(device, host_marks=True)  # when the host has each token (see Clock)
    prompt_device = "cpu" if runner.inputs_on_host else device  # each backend's own input form, made untimed
    gen = torch.Generator().manual_seed(seed * 1_000_003 + batch * 7919 + prompt_length * 31 + new_tokens)
    t0 = time.perf_counter()
    for _ in range(warmup):
        ids, mask = _prompt(torch, gen, vocab, batch, prompt_length, prompt_device)
        runner.generate(ids, mask, new_tokens, make_token_timer(clock))
    clock.synchronize()
    warmup_s = time.perf_counter() - t0
    if clock.on_gpu:
        torch.cuda.reset_peak_memory_stats()
    ttft, tpot, e2e, itl, tps = [], [], [], [], []
    for _ in range(repeats):
        ids, mask = _prompt(torch, gen, vocab, batch, prompt_length, prompt_device)
        timer = make_token_timer(clock)
        clock.synchronize()
        start = clock.mark()
        runner.generate(ids, mask, new_tokens, timer)
        end = clock.mark()
        if len(timer.marks) != new_tokens:
            raise RuntimeError(f"the backend streamed {len(timer.marks)} new tokens, expected {new_tokens}")
        t = split_timings(clock, start, timer.marks, end)
        decode = sum(t["itl_s"])
        ttft.append(t["ttft_s"])
        e2e.append(t["e2e_s"])
        itl.extend(t["itl_s"])
        tpot.append(decode / (new_tokens - 1))
        tps.append(batch * (new_tokens - 1) / decode)
    if clock.on_gpu:
        peak, kind = int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    else:
        peak, kind = peak_rss_bytes(), "process peak RSS (CPU; includes everything this process loaded so far)"
    return {
        "ttft_s": summarize(ttft),
        "tpot_s": summarize(tpot),
        "e2e_s": summarize(e2e),
        "itl_s": summarize(itl),
        "decode_tokens_per_s": summarize(tps),
        "peak_memory_bytes": peak,
        "memory_kind": kind,
        "warmup_s": warmup_s,
    }


def _roofline(runner: Runner, geom: roofline.ModelGeometry, batch: int, prompt: int, new: int,
              ceil: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    weights = roofline.decode_weight_bytes(runner.weight_bytes, runner.embedding_bytes, runner.tied_embeddings)
    decode = roofline.decode_floor(weights, geom, batch, prompt, new, runner.kv_element_bytes,
                                   ceil.get("bandwidth_bytes_per_s"))
    prefill = roofline.prefill_floor(runner.non_embedding_params, geom, batch, prompt, ceil.get("matmul_flops_per_s"),
                                     weights, ceil.get("bandwidth_bytes_per_s"))
    return {
        "decode": decode,
        "prefill": prefill,
        "tpot_pct_of_limit": roofline.percent_of_limit(decode["tpot_floor_s"], measured["tpot_s"]["median"]),
        "ttft_pct_of_limit": roofline.percent_of_limit(prefill["ttft_floor_s"], measured["ttft_s"]["median"]),
    }


def _model_info(source: ModelSource) -> dict[str, Any]:
    from ..models.shapes import parameter_count

    geom = roofline.ModelGeometry.from_config(source.config)
    try:
        params = parameter_count(source.config)
    except AttributeError:
        params = None
    return dict(source.to_dict(), geometry=geom.to_dict(), parameters=params)


def _error_text(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:500]


def run_benchmark(spec: BenchmarkSpec, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run every point of `spec`; return the results document (schema `SCHEMA_ID`)."""
    import torch

    from ..models import default_device

    device = spec.device or default_device()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidArgumentError(f"--device {device} was asked for but torch sees no GPU; use --device cpu.")
    spec = _resolve_spec(spec, device)
    if spec.threads is not None and spec.threads < 1:
        raise InvalidArgumentError(f"--threads must be at least 1, got {spec.threads}.")
    previous_threads = torch.get_num_threads()
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    try:
        return _run(spec, device, log)
    finally:
        torch.set_num_threads(previous_threads)


def _run(spec: BenchmarkSpec, device: str, log: Callable[[str], None]) -> dict[str, Any]:
    import torch

    from .. import __version__
    from ..models import parse_dtype
    from . import tunableop
    from .ceilings import ceilings, environment

    if device.startswith("cuda"):
        index = torch.device(device).index
        torch.cuda.set_device(torch.cuda.current_device() if index is None else index)  # events/memory follow it
    env = environment(device)
    tune_state = tunableop.enable(device, env["arch"], spec.tunable_op_dir) if spec.tunable_op else None
    table = backend_table(device)
    names = choose_backends(spec.backends, table, device)
    if not names:
        raise InvalidArgumentError("No backend is available on this machine; install transformers or name one explicitly.")
    spec.backends = names
    log(f"device: {env['device_name']} ({env['arch']}); backends: {', '.join(names)}")
    ceil = ceilings(env, device, spec.gpu, spec.measure_ceilings)
    source = resolve_source(spec.model, allow_pickle=spec.allow_pickle)
    geom = roofline.ModelGeometry.from_config(source.config)
    points = [(b, p, n) for b in spec.batch_sizes for p in spec.prompt_lengths for n in spec.new_tokens]
    sizes = LoadSizes(max(spec.batch_sizes), max(spec.prompt_lengths),
                      max(spec.prompt_lengths) + max(spec.new_tokens))
    rows: list[dict[str, Any]] = []
    notes: dict[str, list[str]] = {}
    for name in names:
        backend = get_backend(name)
        for dtype_name in spec.dtypes:
            dtype = parse_dtype(dtype_name, device)
            dtype_label = str(dtype).replace("torch.", "")
            for quant in spec.quantizations:
                base = {"backend": name, "dtype": dtype_label, "quantization": quant}
                t0 = time.perf_counter()
                try:
                    runner = backend.load(source, dtype, quant, device, spec.seed, sizes)
                except Exception as err:  # a backend that cannot load this model: record it, go on
                    status = "unavailable" if isinstance(err, UnsupportedModelError) else "error"
                    log(f"{name} {dtype_label} {quant}: {status}: {_error_text(err)}")
                    rows.extend(dict(base, batch_size=b, prompt_length=p, new_tokens=n, status=status,
                                     error=f"load failed: {_error_text(err)}") for b, p, n in points)
                    continue
                load_s = time.perf_counter() - t0
                notes[f"{name}/{dtype_label}/{quant}"] = list(runner.notes)
                try:
                    for b, p, n in points:
                        row = dict(base, batch_size=b, prompt_length=p, new_tokens=n)
                        try:
                            measured = measure_point(runner, device, geom.vocab_size, b, p, n,
                                                     spec.warmup, spec.repeats, spec.seed)
                        except torch.OutOfMemoryError as err:
                            row.update(status="oom", error=_error_text(err))
                            torch.cuda.empty_cache()
                        except Exception as err:  # one failing point must not lose the others
                            row.update(status="error", error=_error_text(err))
                        else:
                            row.update(measured, status="ok", error=None, load_s=load_s,
                                       compiled=bool(runner.is_compiled()),
                                       roofline=_roofline(runner, geom, b, p, n, ceil, measured))
                        rows.append(row)
                        log(_progress_line(row))
                finally:
                    runner.close()
    doc = {
        "schema": SCHEMA_ID,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "optimum_amdx_version": __version__,
        "environment": env,
        "model": _model_info(source),
        "settings": {k: v for k, v in asdict(spec).items() if k != "model"},
        "ceilings": ceil,
        "tunable_op": tunableop.finish(tune_state) if tune_state is not None else None,
        "backends": table,
        "notes": notes,
        "results": rows,
    }
    return validate(doc)


def _progress_line(row: dict[str, Any]) -> str:
    head = f"{row['backend']} {row['dtype']} {row['quantization']} b={row['batch_size']} p={row['prompt_length']} n={row['new_tokens']}"
    if row["status"] != "ok":
        return f"{head}: {row['status']}: {row['error']}"
    return (f"{head}: TTFT {row['ttft_s']['median'] * 1e3:.1f} ms, TPOT {row['tpot_s']['median'] * 1e3:.2f} ms, "
            f"{row['decode_tokens_per_s']['median']:.1f} tok/s")
