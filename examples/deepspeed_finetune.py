"""Fine-tune a causal LM for a few steps with the transformers Trainer and a generated DeepSpeed config.

    # on GPUs (one process per GPU; the config is sized for the GPU named)
    optimum-amdx launch --gpus 8 -- examples/deepspeed_finetune.py --model <folder> --gpu mi300x
    # on CPU processes (what CI runs): DeepSpeed's CPU accelerator over gloo, a tiny random model
    DS_ACCELERATOR=cpu optimum-amdx launch --cpu --gpus 2 -- examples/deepspeed_finetune.py --tiny --zero-stage 2

The config comes from `optimum_amdx.distributed.deepspeed_config` (with "auto" values that the
Trainer fills from its TrainingArguments). Rank 0 writes the losses, the config used and the
DeepSpeed ZeRO stage it really ran to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def build_dataset(vocab_size: int, n: int, seq_len: int, seed: int) -> list[dict]:
    """Seeded random token sequences with a learnable pattern (each sequence repeats a short motif).

    A plain list of examples is a valid map-style dataset for the Trainer, so no `datasets` install is needed.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    motifs = torch.randint(1, vocab_size, (n, 4), generator=gen)
    ids = motifs.repeat(1, seq_len // 4 + 1)[:, :seq_len]
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder; or --tiny for a seeded random tiny Llama")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--gpu", default="mi300x", help="GPU profile the config is sized for")
    parser.add_argument("--zero-stage", type=int, default=None, help="force a ZeRO stage (default: lowest that fits)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="JSON file for rank 0's result")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from optimum_amdx.distributed import deepspeed_config
    from optimum_amdx.models.shapes import shape_config

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    on_cpu = os.environ.get("OPTIMUM_AMDX_DEVICE") == "cpu" or not torch.cuda.is_available()
    torch.manual_seed(args.seed)
    if args.tiny:
        config = shape_config("tiny-llama")
        model = AutoModelForCausalLM.from_config(config)
    elif args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model)
        config = model.config
    else:
        parser.error("give --model or --tiny")

    plan = deepspeed_config(config, gpu=args.gpu, gpus=world_size, task="finetune", seq_len=args.seq_len,
                            zero_stage=args.zero_stage, precision="auto")
    if int(os.environ.get("RANK", 0)) == 0:
        print(plan.table(), file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        training_args = TrainingArguments(
            output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=2, gradient_accumulation_steps=1,
            learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], deepspeed=plan.config,
            use_cpu=on_cpu, bf16=not on_cpu and torch.cuda.is_bf16_supported(), seed=args.seed,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=training_args,
                          train_dataset=build_dataset(config.vocab_size, 64, args.seq_len, args.seed))
        trainer.train()
        losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        stage = trainer.model_wrapped.zero_optimization_stage()
    if int(os.environ.get("RANK", 0)) == 0:
        result = {"losses": losses, "zero_stage_run": stage, "world_size": world_size,
                  "device": "cpu" if on_cpu else torch.cuda.get_device_name(0), "config": plan.config,
                  "estimate": plan.estimate.to_dict()}
        print(f"ZeRO-{stage} on {world_size} process(es): losses {', '.join(f'{x:.3f}' for x in losses)}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
