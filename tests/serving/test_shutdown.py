"""`optimum-amdx serve` as a real process: it starts, serves, and on SIGTERM finishes its stream and exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")

STARTUP_S = 120
EXIT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_finishes_in_flight_stream_and_exits_zero(tiny_dir, tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w+")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # set by the kernel tests' conftest; the server runs PyTorch on the CPU
    proc = subprocess.Popen([sys.executable, "-m", "optimum_amdx", "serve", "--model", str(tiny_dir), "--port",
                             str(port), "--device", "cpu", "--max-num-seqs", "4", "--max-model-len", "256",
                             "--log-level", "warning", "--shutdown-timeout", "50"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + STARTUP_S
        while True:
            assert proc.poll() is None, "the server exited early"
            assert time.monotonic() < end, "the server did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        events: list[dict] = []
        first = threading.Event()

        def stream() -> None:
            body = {"model": str(tiny_dir), "prompt": "the value of", "max_tokens": 64, "temperature": 0,
                    "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=EXIT_S) as res:
                for line in res.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
                        first.set()
                    elif line == "data: [DONE]":
                        events.append({"done": True})

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(STARTUP_S)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_S) == 0
        reader.join(EXIT_S)
        assert events[-1] == {"done": True}
        assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.seek(0)
        print(log.read())
        log.close()


def test_cli_refuses_a_busy_port_without_traceback(tiny_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "optimum_amdx", "serve", "--model", str(tiny_dir), "--port",
                              str(port)], capture_output=True, text=True, timeout=STARTUP_S)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--port" in res.stderr
