"""A bounded load test: 32 concurrent streaming clients of mixed lengths plus a few that hang up early.

Every completed stream must equal the engine's own greedy continuation computed alone, the KV pool
must be whole again afterwards (aborted requests included), and /health must answer throughout.
The pool is small (and max_num_seqs low) so requests queue and get preempted while others stream.
"""

from __future__ import annotations

import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from optimum_amdx.modeling import AMDModelForCausalLM, SamplingParams  # noqa: E402
from optimum_amdx.models import load_tokenizer  # noqa: E402

from .conftest import expected_text, running_server, words  # noqa: E402

NUM_CLIENTS = 32
NUM_HANGUPS = 4
DEADLINE_S = 300


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_many_streams_hangups_no_leaks_health_answers(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    rng = random.Random(0)
    vocab = words()
    jobs = [(" ".join(rng.choices(vocab, k=rng.randint(2, 30))), rng.randint(4, 40)) for _ in range(NUM_CLIENTS)]
    ref_model = AMDModelForCausalLM.from_pretrained(tiny_dir, device="cpu", num_blocks=600, block_size=8,
                                                    max_num_seqs=NUM_CLIENTS, max_model_len=128)
    prompts = [tok(p)["input_ids"] for p, _ in jobs]
    params = [SamplingParams(max_new_tokens=n, stop_token_ids=(tok.eos_token_id,)) for _, n in jobs]
    outs = ref_model.engine.generate(prompts, params)
    want = [expected_text(tok, p, o) for p, o in zip(prompts, outs)]

    model = AMDModelForCausalLM.from_pretrained(tiny_dir, device="cpu", num_blocks=48, block_size=4,
                                                max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128)
    with running_server(model, tok, max_queue_len=64) as (url, state):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        stop = threading.Event()
        health: list[tuple[int, float]] = []

        def poll_health() -> None:
            end = time.monotonic() + DEADLINE_S
            while not stop.is_set() and time.monotonic() < end:
                t0 = time.perf_counter()
                code = httpx.get(f"{url}/health", timeout=30).status_code
                health.append((code, time.perf_counter() - t0))
                time.sleep(0.05)

        def stream(i: int) -> tuple[str, str | None]:
            prompt, n = jobs[i]
            text, reason = [], None
            for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                                   stream=True):
                text.append(chunk.choices[0].text)
                reason = chunk.choices[0].finish_reason or reason
            return "".join(text), reason

        def hang_up(i: int) -> int:
            s = client.completions.create(model="tiny", prompt=jobs[i][0], max_tokens=90, temperature=0, stream=True)
            got = 0
            for _chunk in s:
                got += 1
                if got == 2:
                    break
            s.close()
            return got

        poller = threading.Thread(target=poll_health, daemon=True)
        poller.start()
        with ThreadPoolExecutor(NUM_CLIENTS + NUM_HANGUPS) as pool:
            hangups = [pool.submit(hang_up, i) for i in range(NUM_HANGUPS)]
            results = [pool.submit(stream, i) for i in range(NUM_CLIENTS)]
            results = [f.result(timeout=DEADLINE_S) for f in results]
            assert [f.result(timeout=DEADLINE_S) for f in hangups] == [2] * NUM_HANGUPS
        for i, ((text, reason), expected, out) in enumerate(zip(results, want, outs)):
            assert text == expected, f"client {i}"
            assert reason == ("stop" if out[-1] == tok.eos_token_id else "length"), f"client {i}"

        engine = state.loop.engine
        end = time.monotonic() + 30
        while time.monotonic() < end:
            metrics = httpx.get(f"{url}/metrics").text
            if _metric(metrics, "amdx_kv_blocks_free") == engine.num_blocks and state.in_flight == 0:
                break
            time.sleep(0.05)
        stop.set()
        poller.join(60)
        assert _metric(metrics, "amdx_kv_blocks_free") == _metric(metrics, "amdx_kv_blocks_total") == 48
        assert _metric(metrics, "amdx_num_requests_running") == _metric(metrics, "amdx_num_requests_waiting") == 0
        assert _metric(metrics, 'amdx_requests_total{outcome="aborted"}') == NUM_HANGUPS
        assert engine.scheduler.num_preemptions > 0, "the small pool should have forced preemptions"
        assert not engine._seqs, "finished requests must not stay in the engine"
        assert health and all(code == 200 for code, _ in health)
        assert max(seconds for _, seconds in health) < 10.0
