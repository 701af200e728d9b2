"""Serving benchmark: throughput and TTFT/TPOT percentiles of an OpenAI-compatible server over a request-rate sweep.

Three subcommands:

    # against any running server (ours, `transformers serve`, vLLM...): streamed /v1/completions
    python benchmarks/bench_serve.py sweep --url http://127.0.0.1:8000 --model default --rates 2,8,inf \
        --num-requests 64 --prompt-words 64:256 --max-tokens 128 --out serve.json

    # a random-weight model folder of a named shape with a given tokenizer (no download)
    python benchmarks/bench_serve.py random-model --shape llama-1b --tokenizer TOKENIZER_DIR --out /tmp/rnd

    # start `optimum-amdx serve` and then `transformers serve --continuous-batching` on the same folder,
    # sweep each with the same seeded workload, print them side by side and write one JSON
    python benchmarks/bench_serve.py compare --model-dir /tmp/rnd --rates 8,32,inf --out compare.json

Requests arrive as a Poisson process at each rate ("inf": all at once), seeded. Prompts are random
words (so both servers tokenize the same text); every request asks for the same `--max-tokens`
with greedy decoding. A request's TTFT is the time from sending it to its first non-empty text
chunk; its TPOT is (last chunk - first chunk) / (completion tokens - 1), the completion tokens
taken from the usage the server reports (so a request that meets end-of-sequence early is counted
as what it generated). Throughput = all completion tokens / wall time from the first send to the
last answer. A request that fails is counted and reported, never silently dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

WORDS = ("time data model value system order number point group light water power voice table house story "
         "river paper music field stone glass plant market money north heart night energy garden window "
         "question morning city family office summer letter member island forest ocean bridge engine").split()


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    tpot: float = 0.0
    latency: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


@dataclass
class RateResult:
    rate: str
    num_requests: int
    failed: int
    duration_s: float
    output_tok_s: float
    request_s: float
    mean_prompt_tokens: float
    mean_completion_tokens: float
    ttft_ms: dict[str, float] = field(default_factory=dict)
    tpot_ms: dict[str, float] = field(default_factory=dict)
    latency_s: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _percentiles(values: list[float], scale: float) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)

    def pct(p: float) -> float:
        k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
        return s[k] * scale

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "mean": statistics.fmean(s) * scale}


def make_prompts(n: int, lo: int, hi: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


async def _one(client: Any, url: str, body: dict[str, Any]) -> RequestResult:
    start = time.perf_counter()
    first = last = None
    usage: dict[str, Any] | None = None
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as res:
            if res.status_code != 200:
                text = (await res.aread()).decode(errors="replace")
                return RequestResult(ok=False, error=f"HTTP {res.status_code}: {text[:200]}")
            async for line in res.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    return RequestResult(ok=False, error=str(data["error"])[:200])
                if data.get("usage"):
                    usage = data["usage"]
                for choice in data.get("choices") or []:
                    if choice.get("text"):
                        now = time.perf_counter()
                        first = first if first is not None else now
                        last = now
                        chunks += 1
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash of the benchmark
        return RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
    end = time.perf_counter()
    if first is None:
        return RequestResult(ok=False, error="no text received")
    tokens = int(usage["completion_tokens"]) if usage else chunks
    return RequestResult(ok=True, ttft=first - start, tpot=(last - first) / max(1, tokens - 1), latency=end - start,
                         completion_tokens=tokens, prompt_tokens=int(usage["prompt_tokens"]) if usage else 0)


async def run_rate(url: str, model: str, prompts: list[str], max_tokens: int, rate: float, seed: int,
                   stream_options: bool, timeout: float) -> RateResult:
    import httpx

    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
            if stream_options:
                body["stream_options"] = {"include_usage": True}
            tasks.append(asyncio.ensure_future(_one(client, url, body)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    good = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in good)
    return RateResult(
        rate="inf" if rate == float("inf") else f"{rate:g}", num_requests=len(prompts),
        failed=len(results) - len(good), duration_s=duration, output_tok_s=tokens / duration,
        request_s=len(good) / duration,
        mean_prompt_tokens=statistics.fmean([r.prompt_tokens for r in good]) if good else 0.0,
        mean_completion_tokens=statistics.fmean([r.completion_tokens for r in good]) if good else 0.0,
        ttft_ms=_percentiles([r.ttft for r in good], 1e3), tpot_ms=_percentiles([r.tpot for r in good], 1e3),
        latency_s=_percentiles([r.latency for r in good], 1.0),
        errors=sorted({r.error for r in results if not r.ok})[:5])


def sweep(url: str, model: str, rates: list[float], num_requests: int, prompt_words: tuple[int, int],
          max_tokens: int, seed: int, stream_options: bool = True, warmup: int = 4,
          timeout: float = 600.0) -> list[RateResult]:
    """Warm up, then one RateResult per rate (same seeded prompts at every rate)."""
    prompts = make_prompts(num_requests, *prompt_words, seed)
    if warmup:
        asyncio.run(run_rate(url, model, prompts[:warmup], max_tokens, float("inf"), seed, stream_options, timeout))
    return [asyncio.run(run_rate(url, model, prompts, max_tokens, r, seed, stream_options, timeout)) for r in rates]


def table(rows: list[tuple[str, RateResult]]) -> str:
    head = ("| server | rate (req/s) | ok/total | output tok/s | req/s | TTFT p50 / p90 / p99 (ms) | "
            "TPOT p50 / p90 / p99 (ms) | mean out tokens |")
    lines = [head, "|" + "---|" * 8]
    for label, r in rows:
        t, p = r.ttft_ms, r.tpot_ms
        lines.append(
            f"| {label} | {r.rate} | {r.num_requests - r.failed}/{r.num_requests} | {r.output_tok_s:.0f} | "
            f"{r.request_s:.2f} | {t.get('p50', 0):.0f} / {t.get('p90', 0):.0f} / {t.get('p99', 0):.0f} | "
            f"{p.get('p50', 0):.1f} / {p.get('p90', 0):.1f} / {p.get('p99', 0):.1f} | {r.mean_completion_tokens:.0f} |")
    return "\n".join(lines)


def _parse_rates(text: str) -> list[float]:
    return [float("inf") if r.strip() == "inf" else float(r) for r in text.split(",")]


def _parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def random_model(shape: str, tokenizer_dir: str, out: str, dtype: str, device: str, seed: int) -> None:
    """Write a random-weight model folder (safetensors) of `shape` with the tokenizer of `tokenizer_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_amdx.models.shapes import shape_config

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = shape_config(shape, vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                          pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _wait_health(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering /health")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no healthy server at {url} after {timeout:.0f} s")


def _stop(proc: subprocess.Popen, timeout: float = 30) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run the same sweep on `optimum-amdx serve` and on `transformers serve --continuous-batching`."""
    servers = {
        "optimum-amdx": ([sys.executable, "-m", "optimum_amdx", "serve", "--model", args.model_dir, "--dtype",
                          args.dtype, "--max-num-seqs", str(args.max_num_seqs), "--port", str(args.port),
                          "--log-level", "warning"] + (["--max-model-len", str(args.max_model_len)]
                                                       if args.max_model_len else []), True),
        "transformers serve": ([sys.executable, "-m", "transformers.cli.transformers", "serve", args.model_dir,
                                "--continuous-batching", "--dtype", {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(
                                    args.dtype, args.dtype), "--port", str(args.port), "--host", "127.0.0.1",
                                "--log-level", "warning"] + args.transformers_args.split(), False),
    }
    results: dict[str, Any] = {}
    rows: list[tuple[str, RateResult]] = []
    for name in args.servers.split(","):
        cmd, stream_options = servers[name]
        url = f"http://127.0.0.1:{args.port}"
        log = open(os.path.join(args.log_dir, f"{name.replace(' ', '_')}.log"), "w")
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            started = time.perf_counter()
            _wait_health(url, proc, args.startup_timeout)
            print(f"   healthy after {time.perf_counter() - started:.1f} s", flush=True)
            res = sweep(url, args.model_dir, _parse_rates(args.rates), args.num_requests,
                        _parse_range(args.prompt_words), args.max_tokens, args.seed, stream_options,
                        warmup=args.warmup)
            results[name] = [asdict(r) for r in res]
            rows += [(name, r) for r in res]
            print(table([(name, r) for r in res]), flush=True)
        except Exception as exc:  # noqa: BLE001 - report one server's failure and go on to the next
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"   {name} failed: {exc}", flush=True)
        finally:
            code = _stop(proc)
            log.close()
            results.setdefault(f"{name} exit code", code)
    print("\n" + table(rows), flush=True)
    return results


def _device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    def workload(p: argparse.ArgumentParser) -> None:
        p.add_argument("--rates", default="2,8,inf", help="Comma-separated request rates (req/s); 'inf' = all at once.")
        p.add_argument("--num-requests", type=int, default=64)
        p.add_argument("--prompt-words", default="64:256", help="Prompt length range in words, lo:hi.")
        p.add_argument("--max-tokens", type=int, default=128)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--warmup", type=int, default=4, help="Requests sent (all at once) before measuring.")
        p.add_argument("--out", default=None, help="Write the results as JSON here.")

    s = sub.add_parser("sweep", help="Sweep a running server.")
    s.add_argument("--url", default="http://127.0.0.1:8000")
    s.add_argument("--model", default="default")
    s.add_argument("--label", default="server")
    s.add_argument("--no-stream-options", action="store_true", help="Do not send stream_options (usage from the "
                   "server's last chunk, if any, else one token per text chunk).")
    workload(s)
    r = sub.add_parser("random-model", help="Write a random-weight model folder.")
    r.add_argument("--shape", default="llama-1b")
    r.add_argument("--tokenizer", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--dtype", default="float16")
    r.add_argument("--device", default="cuda")
    r.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare", help="optimum-amdx serve vs transformers serve on one model folder.")
    c.add_argument("--model-dir", required=True)
    c.add_argument("--servers", default="optimum-amdx,transformers serve")
    c.add_argument("--dtype", default="fp16")
    c.add_argument("--max-num-seqs", type=int, default=64)
    c.add_argument("--max-model-len", type=int, default=None)
    c.add_argument("--port", type=int, default=8011)
    c.add_argument("--startup-timeout", type=float, default=300)
    c.add_argument("--transformers-args", default="", help="Extra flags for `transformers serve`.")
    c.add_argument("--log-dir", default=".")
    workload(c)
    args = parser.parse_args(argv)
    if args.cmd != "random-model" and args.out:  # random-model's --out is a model folder, not a result file
        from optimum_amdx.io import result_path_or_exit, write_json  # here: a bare sweep needs no optimum_amdx

        result_path_or_exit(args.out)  # before any server starts; --out replaces only a result we wrote

    if args.cmd == "random-model":
        random_model(args.shape, args.tokenizer, args.out, args.dtype, args.device, args.seed)
        return 0
    meta = {"device": _device_name(), "cmd": args.cmd, "args": {k: v for k, v in vars(args).items() if k != "cmd"},
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if args.cmd == "sweep":
        res = sweep(args.url, args.model, _parse_rates(args.rates), args.num_requests, _parse_range(args.prompt_words),
                    args.max_tokens, args.seed, not args.no_stream_options, warmup=args.warmup)
        print(table([(args.label, x) for x in res]))
        meta["results"] = {args.label: [asdict(x) for x in res]}
    else:
        meta["results"] = compare(args)
    if args.out:
        write_json(args.out, meta, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
