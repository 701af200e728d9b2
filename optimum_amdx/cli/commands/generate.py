"""`optimum-amdx generate`: complete a prompt with a causal LM (PyTorch), greedy unless sampling is asked for."""

from __future__ import annotations

import argparse
import sys
import time

NAME = "generate"
HELP = "Generate a completion for a prompt with a causal LM (PyTorch path; 'default' = bundled SmolLM2-135M)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="The text to complete.")
    parser.add_argument("--model", default="default", help="Hub id, local folder, or 'default' (bundled SmolLM2-135M).")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--do-sample", action="store_true", help="Sample instead of greedy decoding.")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="Random seed for sampling.")
    parser.add_argument("--chat", action="store_true", help="Wrap the prompt in the model's chat template.")
    parser.add_argument("--dtype", default="auto", help="auto (fp16 on GPU, fp32 on CPU), fp16, bf16 or fp32.")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if one is visible).")
    parser.add_argument("--engine", choices=("auto", "amdx", "transformers"), default="auto",
                        help="amdx: our paged-attention runtime (AMDModelForCausalLM); transformers: plain generate(); "
                             "auto: amdx on a GPU, transformers on the CPU.")
    parser.add_argument("--allow-pickle", action="store_true", help="Allow loading .bin/.pt weights (runs pickle).")
    parser.add_argument("--trust-remote-code", action="store_true")


def _sampling_kwargs(args: argparse.Namespace) -> dict:
    kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": args.do_sample}
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    return kwargs


def _load(args: argparse.Namespace, device: str, folder):  # noqa: ANN001 - a models.ModelFolder
    """The model to generate with: ours (AMDModelForCausalLM) or plain transformers."""
    from ...models import load_causal_lm

    engine = args.engine
    if engine == "auto":
        engine = "amdx" if device.startswith("cuda") else "transformers"
    if engine == "amdx":
        from ...modeling import AMDModelForCausalLM

        return AMDModelForCausalLM.from_pretrained(folder, dtype=args.dtype, device=device), engine
    model = load_causal_lm(folder, dtype=args.dtype, device=device)
    return model, engine


def run(args: argparse.Namespace) -> int:
    from ..output import data_stdout

    with data_stdout() as out:  # only the text on stdout; library log lines (DeepSpeed's, at import) go to stderr
        return _generate(args, out)


def _streamer(tokenizer, out, skip_prompt: bool):  # noqa: ANN001, ANN202 - a tokenizer, a text stream
    """transformers' TextStreamer, writing to `out` instead of whatever sys.stdout is."""
    from transformers import TextStreamer

    class _Streamer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            out.write(text + ("\n" if stream_end else ""))
            out.flush()

    return _Streamer(tokenizer, skip_prompt=skip_prompt, skip_special_tokens=True)


def _generate(args: argparse.Namespace, out) -> int:  # noqa: ANN001 - a text stream
    import torch

    from ...errors import InvalidArgumentError
    from ...models import default_device, load_tokenizer, open_model
    from ..checks import check_sampling

    if not args.prompt.strip():
        raise InvalidArgumentError('The prompt is empty; give the text to complete, e.g. '
                                   'optimum-amdx generate "The three primary colors are".')
    if args.max_new_tokens < 1:
        raise InvalidArgumentError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}.")
    check_sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty, args.do_sample)
    device = args.device or default_device()
    torch.manual_seed(args.seed)
    folder = open_model(args.model, allow_pickle=args.allow_pickle, trust_remote_code=args.trust_remote_code)
    tokenizer = load_tokenizer(folder)
    model, engine = _load(args, device, folder)
    text = args.prompt
    if args.chat:
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidArgumentError(f"{args.model} has no chat template; leave out --chat to complete the prompt as "
                                       "plain text.")
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt").to(device)
    if args.chat:
        # the chat template adds a system prompt and role markers: show the user's prompt, not the template
        out.write(args.prompt + "\n")
    streamer = _streamer(tokenizer, out, skip_prompt=args.chat)
    start = time.perf_counter()
    output = model.generate(**inputs, streamer=streamer, pad_token_id=tokenizer.pad_token_id, **_sampling_kwargs(args))
    elapsed = time.perf_counter() - start
    new_tokens = int(output.shape[-1] - inputs["input_ids"].shape[-1])
    print(f"[{new_tokens} tokens in {elapsed:.2f} s, {new_tokens / elapsed:.1f} tokens/s, engine={engine}, "
          f"device={device}]", file=sys.stderr)
    return 0
