"""GPTQ quality on SmolLM2-135M: perplexity of fp32, RTN, our GPTQ and GPT-QModel 7.6 on the same data.

All quantized variants use 4 bits, group size 128 (SmolLM2's K=576 gives a shorter last group of 64,
as in every GPTQ tool), symmetric, the same calibration windows (--samples x --seqlen tokens of the
pydoc_data.topics "train" part, seeded) and the same damping. Perplexity is measured by our runtime
in fp32 on the held-out last 10% of the pydoc text (non-overlapping windows of --eval-seqlen), for
every checkpoint, including GPT-QModel's (tests/quantization/test_interop.py shows our runtime
matches GPT-QModel's own on its checkpoints). Runs on the CPU.

    python benchmarks/gptq_quality.py --out gptq_quality.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch


def _ppl(model, tokens, seqlen):
    from optimum_amdx.quantization import perplexity

    return perplexity(model, tokens, seqlen=seqlen)


def _ours(path, tokenizer, samples, method, cfg_kwargs, out_dir):
    from optimum_amdx.models import load_causal_lm
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, load_gptq_model

    model = load_causal_lm(path, dtype=torch.float32, device="cpu")
    quantizer = GPTQQuantizer(GPTQConfig(**cfg_kwargs), method=method, device="cpu", verbose=False)
    start = time.perf_counter()
    quantizer.quantize(model, tokenizer, samples)
    seconds = time.perf_counter() - start
    quantizer.save_pretrained(model, out_dir, tokenizer, overwrite=True)
    return load_gptq_model(out_dir, "cpu", torch.float32), seconds


def _gptqmodel(path, samples, cfg_kwargs, out_dir):
    """GPT-QModel with its own defaults beyond the shared settings (act_group_aware is on when desc_act is off)."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel, QuantizeConfig

    from optimum_amdx.quantization import load_gptq_model

    extra = {"act_group_aware": cfg_kwargs["act_group_aware"]} if "act_group_aware" in cfg_kwargs else {}
    qc = QuantizeConfig(bits=cfg_kwargs["bits"], group_size=cfg_kwargs["group_size"], desc_act=cfg_kwargs["desc_act"],
                        sym=cfg_kwargs["sym"], damp_percent=cfg_kwargs["damp_percent"], **extra)
    model = GPTQModel.load(str(path), qc, dtype=torch.float32)
    start = time.perf_counter()
    model.quantize([{"input_ids": s, "attention_mask": torch.ones_like(s)} for s in samples], batch_size=1)
    seconds = time.perf_counter() - start
    model.save(str(out_dir))
    return load_gptq_model(out_dir, "cpu", torch.float32), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--eval-seqlen", type=int, default=512)
    parser.add_argument("--damp-percent", type=float, default=0.05)
    parser.add_argument("--variants", default="fp,rtn,gptq,gptq-gar,gptq-desc,peer,peer-plain,peer-desc",
                        help="comma list of fp, rtn, gptq, gptq-gar, gptq-desc (ours), peer, peer-plain, peer-desc (GPT-QModel)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    from optimum_amdx.models import load_causal_lm, load_tokenizer, resolve_model
    from optimum_amdx.quantization import get_calibration_data
    from optimum_amdx.quantization.calibration import describe_split, get_eval_tokens

    torch.manual_seed(0)
    path = resolve_model(args.model)
    tokenizer = load_tokenizer(path)
    samples = get_calibration_data("pydoc", tokenizer, args.samples, args.seqlen, seed=0)
    eval_tokens = get_eval_tokens("pydoc", tokenizer)
    base = dict(bits=4, group_size=128, sym=True, desc_act=False, damp_percent=args.damp_percent,
                n_samples=args.samples, seqlen=args.seqlen)
    wanted = set(args.variants.split(","))
    rows = []
    if "fp" in wanted:
        fp = load_causal_lm(path, dtype=torch.float32, device="cpu")
        rows.append({"variant": "fp32 (unquantized)", "ppl": _ppl(fp, eval_tokens, args.eval_seqlen), "quantize_s": 0.0})
        del fp
    desc = {**base, "desc_act": True}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = [("rtn", "RTN 4-bit g128 (ours)", "rtn", base),
                ("gptq", "GPTQ 4-bit g128 act_group_aware off (ours)", "gptq", {**base, "act_group_aware": False}),
                ("gptq-gar", "GPTQ 4-bit g128 act_group_aware (ours, default)", "gptq", {**base, "act_group_aware": True}),
                ("gptq-desc", "GPTQ 4-bit g128 desc_act (ours)", "gptq", {**desc, "act_group_aware": False}),
                ("peer", "GPTQ 4-bit g128 (GPT-QModel 7.6.0, its default act_group_aware)", "peer", base),
                ("peer-plain", "GPTQ 4-bit g128 act_group_aware off (GPT-QModel 7.6.0)", "peer",
                 {**base, "act_group_aware": False}),
                ("peer-desc", "GPTQ 4-bit g128 desc_act (GPT-QModel 7.6.0)", "peer", desc)]
        for key, name, method, kw in runs:
            if key not in wanted:
                continue
            out_dir = tmp / key
            if method == "peer":
                model, seconds = _gptqmodel(path, samples, kw, out_dir)
            else:
                model, seconds = _ours(path, tokenizer, samples, method, kw, out_dir)
            rows.append({"variant": name, "ppl": _ppl(model, eval_tokens, args.eval_seqlen), "quantize_s": seconds})
            print(rows[-1], flush=True)
    n_windows = len(eval_tokens) // args.eval_seqlen
    meta = {"model": str(path), "calibration": f"{args.samples} x {args.seqlen} tokens, seed 0",
            "evaluation": f"{n_windows} windows x {args.eval_seqlen} tokens; {describe_split()}",
            "damp_percent": args.damp_percent, "device": "cpu", "torch_threads": torch.get_num_threads()}
    print(f"\nSmolLM2-135M perplexity, {meta['evaluation']}; calibration {meta['calibration']} (CPU)")
    print(f"{'variant':<46} {'perplexity':>10} {'quantize s':>11}")
    for r in rows:
        print(f"{r['variant']:<46} {r['ppl']:>10.3f} {r['quantize_s']:>11.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
