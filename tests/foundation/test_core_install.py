"""The core install (no extras, so no triton) imports and runs on CPU: `import optimum_amdx`, the CLI
(`--help`, `env`, `generate`) and `AMDModelForCausalLM`, in a subprocess where importing triton fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap

NO_TRITON = textwrap.dedent("""
    import sys
    sys.modules["triton"] = None          # as if triton were not installed: `import triton` raises ImportError
    import torch
    torch.set_num_threads(1)
""")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TRITON + textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=600)


def test_package_cli_and_amd_model_work_without_triton(tmp_path):
    code = """
        import contextlib, io, sys
        import optimum_amdx
        from optimum_amdx.cli.main import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            try:
                main(["--help"])
            except SystemExit as exit:
                assert exit.code == 0, exit.code
        assert "generate" in out.getvalue() and "env" in out.getvalue()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["env"]) == 0
        assert "not installed" in out.getvalue()

        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
        model.generation_config.eos_token_id = None
        model.save_pretrained(sys.argv[1])
        from optimum_amdx import AMDModelForCausalLM
        am = AMDModelForCausalLM.from_pretrained(sys.argv[1], device="cpu", dtype="fp32", num_blocks=16)
        prompt = [5, 9, 17, 33, 2]
        got = am.generate([prompt], max_new_tokens=6)[0]
        ids = torch.tensor([prompt])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             pad_token_id=0)[0, len(prompt):].tolist()
        assert got == ref, (got, ref)
        assert sys.modules["triton"] is None
        loaded = sorted(m for m in sys.modules if m.startswith("optimum_amdx.kernels.") and "triton" in m)
        assert not loaded, loaded
        print("ok")
    """
    result = _run(code, str(tmp_path / "tiny"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
