"""One real end-to-end run of `optimum-amdx benchmark` on the tiny-llama shape, shared by the tests."""

import json

import pytest

from optimum_amdx.cli.main import main

TINY_ARGS = ["benchmark", "--model", "tiny-llama", "--device", "cpu", "--backends", "transformers",
             "--batch-sizes", "1,2", "--prompt-lengths", "8", "--new-tokens", "5", "--warmup", "1",
             "--repeats", "2", "--seed", "3", "--threads", "1"]


@pytest.fixture(scope="session")
def tiny_args():
    """CLI arguments of the shared run, without --output-dir."""
    return list(TINY_ARGS)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(exit code, output folder, results document) of a two-point CPU benchmark."""
    out = tmp_path_factory.mktemp("bench") / "run"
    code = main(TINY_ARGS + ["--output-dir", str(out)])
    doc = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    return code, out, doc
