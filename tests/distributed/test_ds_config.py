"""DeepSpeed configs: memory estimates against hand calculations, every config parsed by DeepSpeed."""

from __future__ import annotations

import json

import pytest

from optimum_amdx.distributed import deepspeed_config, fill_auto_values, validate_deepspeed_config
from optimum_amdx.distributed.ds_config import GPU_HEADROOM
from optimum_amdx.errors import InvalidArgumentError

pytest.importorskip("deepspeed")

# Parameter counts of the public Llama-2 configs (embedding + 32/40/80 layers + untied head).
PSI = {"llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192}
HBM_GB = {"mi210": 64, "mi250": 64, "mi300x": 192}
WORLDS = [(1, 1), (8, 1), (8, 2)]  # (gpus per node, nodes): 1, 8 and 16 GPUs


def model_state_bytes(psi: int, stage: int, n: int, offload_opt: str, offload_param: str) -> float:
    """Hand rule from the ZeRO paper: 2 + 2 + 12 bytes/param, split over n ranks by stage."""
    params = 2 * psi / (n if stage == 3 else 1)
    grads = 2 * psi / (n if stage >= 2 else 1)
    optim = 12 * psi / (n if stage >= 1 else 1)
    if offload_opt != "none":
        optim = 0
        if stage >= 2:
            grads = 0
    if offload_param != "none":
        params = 0
    return params + grads + optim


@pytest.mark.parametrize("model", sorted(PSI))
@pytest.mark.parametrize("gpu", sorted(HBM_GB))
@pytest.mark.parametrize("gpus,nodes", WORLDS)
def test_config_fits_and_is_accepted_by_deepspeed(model, gpu, gpus, nodes):
    plan = deepspeed_config(model, gpu=gpu, gpus=gpus, nodes=nodes, task="finetune", nvme_path="/local_nvme")
    n = gpus * nodes
    est = plan.estimate
    p = est.placement
    assert plan.num_params == PSI[model]
    states = est.params_bytes + est.grads_bytes + est.optimizer_bytes
    assert states == pytest.approx(model_state_bytes(PSI[model], p.zero_stage, n, p.offload_optimizer,
                                                     p.offload_param))
    usable = HBM_GB[gpu] * GPU_HEADROOM * 1e9
    assert est.gpu_total_bytes <= usable
    # Everything cheaper on the ladder was tried and did not fit.
    for text, gb in plan.rejected:  # a cheaper rung fails on GPU memory, or (offload to cpu) on host memory
        assert gb * 1e9 > usable or "on cpu" in text
    assert plan.config["zero_optimization"]["stage"] == p.zero_stage
    assert plan.config["train_micro_batch_size_per_gpu"] == "auto"
    parsed = validate_deepspeed_config(plan.config, world_size=n)
    assert parsed.zero_optimization_stage == p.zero_stage
    assert parsed.train_batch_size == n  # micro-batch 1 x accumulation 1 x world size
    if p.offload_optimizer != "none":
        device = parsed.zero_config.offload_optimizer.device
        assert getattr(device, "value", device) == p.offload_optimizer
        assert plan.config["optimizer"]["type"] == "AdamW"
    assert str(plan.estimate.world_size) in plan.table() and "total (per GPU)" in plan.table()


def test_hand_calculation_7b_one_mi300x():
    # 16 bytes x 6.738e9 params = 107.81 GB of model states.
    # Activations, 32 layers x s*b*h*(34 + 5*a*s/h) with s=2048, b=1, h=4096, a=32:
    #   34 + 5*32*2048/4096 = 114 -> 32 * 2048*4096*114 = 30_601_641_984 bytes
    # fp32 logits and their gradient: 8 * 2048 * 32000 = 524_288_000 bytes
    plan = deepspeed_config("llama-2-7b", gpu="mi300x", gpus=1, task="finetune")
    est = plan.estimate
    assert est.placement.zero_stage == 0 and not est.placement.activation_checkpointing
    assert est.params_bytes + est.grads_bytes + est.optimizer_bytes == 16 * 6_738_415_616
    assert est.activations_bytes == pytest.approx(30_601_641_984 + 524_288_000)
    assert est.gpu_total_bytes / 1e9 == pytest.approx(107.815 + 30.602 + 0.524, abs=0.01)


def test_hand_calculation_70b_eight_mi300x_needs_zero3_and_checkpointing():
    # ZeRO-3 over 8: 16 * 68.977e9 / 8 = 137.95 GB of states. Without checkpointing the 80 layers
    # hold 80 * 2048*8192*(34 + 5*64*2048/8192 = 114) = 153.0 GB -> too much for 172.8 GB usable.
    # With checkpointing: 80 * 2*2048*8192 + 1 layer = 2.68 + 1.91 GB; logits 0.52 GB;
    # gathered working set: 2 layers of 16-bit weights, a layer being (68.977e9 - 2 * 32000*8192) / 80
    # = 855.7M parameters (larger than the 262M embedding) -> 3.42 GB.
    plan = deepspeed_config("llama-2-70b", gpu="mi300x", gpus=8, task="finetune")
    est = plan.estimate
    assert (est.placement.zero_stage, est.placement.activation_checkpointing) == (3, True)
    assert est.params_bytes + est.grads_bytes + est.optimizer_bytes == pytest.approx(16 * 68_976_648_192 / 8)
    layer = 2048 * 8192 * 114
    assert est.activations_bytes == pytest.approx(80 * 2 * 2048 * 8192 + layer + 8 * 2048 * 32000)
    assert est.working_set_bytes == pytest.approx(4 * (68_976_648_192 - 2 * 32000 * 8192) // 80)
    assert "gradient_checkpointing=True" in plan.explanation


def test_13b_on_one_mi210_offloads_optimizer_to_host():
    plan = deepspeed_config("llama-2-13b", gpu="mi210", gpus=1, task="finetune")
    p = plan.estimate.placement
    assert (p.zero_stage, p.offload_optimizer) == (2, "cpu")
    # Host holds fp32 master + Adam states (12 B) and the fp16 gradient partition (2 B) per parameter.
    assert plan.estimate.cpu_bytes_per_node == pytest.approx(14 * 13_015_864_320)
    assert plan.config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_inference_task_has_no_optimizer_state():
    plan = deepspeed_config("llama-2-70b", gpu="mi300x", gpus=8, task="inference")
    est = plan.estimate
    assert est.grads_bytes == 0 and est.optimizer_bytes == 0
    assert "optimizer" not in plan.config and "gradient_accumulation_steps" not in plan.config
    validate_deepspeed_config(plan.config, world_size=8)


def test_forced_stage_and_precision():
    plan = deepspeed_config("llama-2-7b", gpu="mi300x", gpus=8, zero_stage=3, precision="bf16")
    assert plan.config["zero_optimization"]["stage"] == 3
    assert plan.config["bf16"] == {"enabled": True} and plan.config["fp16"] == {"enabled": False}
    assert plan.config["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"


def test_auto_values_filled_like_the_trainer():
    plan = deepspeed_config("llama-2-7b", gpu="mi250", gpus=8, zero_stage=3)
    filled = fill_auto_values(plan.config, world_size=16, hidden_size=4096, micro_batch=2,
                              gradient_accumulation_steps=4)
    assert filled["train_batch_size"] == 2 * 4 * 16
    assert filled["zero_optimization"]["reduce_bucket_size"] == 4096 * 4096
    assert "auto" not in json.dumps(filled)
    assert "auto" in json.dumps(plan.config)  # the original is untouched


def test_deepspeed_rejects_inconsistent_batch():
    config = {"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 1}}
    with pytest.raises(InvalidArgumentError, match="DeepSpeed rejected"):
        validate_deepspeed_config(config, world_size=2)


def test_config_from_config_json(tmp_path):
    from optimum_amdx.models.shapes import shape_config

    path = tmp_path / "config.json"
    path.write_text(shape_config("llama-2-7b").to_json_string())
    plan = deepspeed_config(str(path), gpu="mi300x", gpus=1)
    assert plan.num_params == PSI["llama-2-7b"]


def test_unknown_gpu_is_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="Unknown GPU 'mi999'.*mi300x"):
        deepspeed_config("llama-2-7b", gpu="mi999")


def test_model_that_cannot_fit_even_with_offload():
    with pytest.raises(InvalidArgumentError, match=r"do not fit .* even with ZeRO-3, optimizer on cpu, parameters on "
                                                   r"cpu.*NVMe path"):
        deepspeed_config("llama-2-70b", gpu="rx7900xtx", gpus=1, cpu_memory_gb=128)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gpus=0), "gpus=0"), (dict(task="pretrain"), "task='pretrain'"), (dict(zero_stage=4), "zero_stage=4"),
    (dict(precision="int8"), "precision='int8'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        deepspeed_config("llama-2-7b", **kwargs)


def test_cli_writes_config_and_table(tmp_path, capsys):
    from optimum_amdx.cli.main import main

    out = tmp_path / "ds.json"
    assert main(["deepspeed-config", "--model", "llama-2-13b", "--gpus", "8", "--gpu", "mi250", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Memory estimate: 13.02B parameters" in err and "accepted by deepspeed" in err
    config = json.loads(out.read_text())
    assert config["zero_optimization"]["stage"] in (1, 2, 3)
    assert main(["deepspeed-config", "--model", "llama-2-7b", "--gpu", "nope"]) == 2
    assert "Unknown GPU 'nope'" in capsys.readouterr().err


def test_other_architectures_are_counted_on_the_meta_device():
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_embd=128, n_layer=3, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0)
    plan = deepspeed_config(config, gpu="mi210", gpus=2)
    real = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert plan.num_params == real
    assert plan.estimate.params_bytes == 2 * real  # ZeRO-0 keeps whole 16-bit weights on each GPU
