"""Checks of CLI input that must fail before any work starts, with the fix in the message."""

from __future__ import annotations

from ..errors import HardwareError, InvalidArgumentError


def check_device(device: str) -> None:
    """`device` is cpu, or cuda[:N] on a PyTorch that sees that GPU (ROCm GPUs are `cuda` in PyTorch)."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise InvalidArgumentError(
            f"--device {device!r} is not a device; use cpu, cuda or cuda:N (AMD GPUs are 'cuda' in PyTorch)."
        ) from None
    if parsed.type == "cpu":
        return
    if parsed.type != "cuda":
        raise InvalidArgumentError(
            f"--device {device!r}: optimum-amdx runs on cpu or cuda[:N] (AMD GPUs are 'cuda' in PyTorch, "
            "also on ROCm)."
        )
    if not torch.cuda.is_available():
        build = "a CPU-only build" if not (torch.version.cuda or torch.version.hip) else "a GPU build that sees no GPU"
        raise HardwareError(
            f"--device {device}: this PyTorch ({torch.__version__}) is {build}. Run `optimum-amdx env` to see what "
            "is missing and how to fix it, or use --device cpu."
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise HardwareError(
            f"--device {device}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1}); check HIP_VISIBLE_DEVICES / "
            "CUDA_VISIBLE_DEVICES or run `optimum-amdx env`."
        )


def check_sampling(temperature: float | None, top_k: int | None, top_p: float | None,
                   repetition_penalty: float | None, do_sample: bool) -> None:
    """Sampling values transformers would reject mid-generation (or silently ignore), checked up front."""
    if temperature is not None and not temperature > 0:
        raise InvalidArgumentError(f"--temperature must be greater than 0, got {temperature}; for greedy decoding "
                                   "leave out --do-sample instead.")
    if top_p is not None and not 0 < top_p <= 1:
        raise InvalidArgumentError(f"--top-p must be in (0, 1], got {top_p}; 1 turns nucleus sampling off.")
    if top_k is not None and top_k < 0:
        raise InvalidArgumentError(f"--top-k must be 0 (off) or a positive number of tokens, got {top_k}.")
    if repetition_penalty is not None and not repetition_penalty > 0:
        raise InvalidArgumentError(f"--repetition-penalty must be greater than 0 (1 = no penalty), "
                                   f"got {repetition_penalty}.")
    given = [f"--{n}" for n, v in (("temperature", temperature), ("top-k", top_k), ("top-p", top_p)) if v is not None]
    if given and not do_sample:
        verb, them = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise InvalidArgumentError(f"{', '.join(given)} only {verb} when sampling; add --do-sample (or leave {them} "
                                   "out for greedy decoding).")
