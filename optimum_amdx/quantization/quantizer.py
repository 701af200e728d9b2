"""`GPTQQuantizer`: layer-by-layer GPTQ (or RTN) over a transformers causal LM.

Flow: run the calibration samples through the model up to the first decoder block and keep that
block's inputs; then, block by block on the execution device: collect input Hessians of the
block's linears (in dependency order with true_sequential, re-running the block after each
step so later linears see already-quantized inputs), quantize them, pack them into `QuantLinear`,
and run the quantized block to produce the next block's inputs. Only one block and the
activations of the calibration set live on the device at a time. With `lm_head`, the output head is
quantized last, its Hessian taken from the final norm of the last block's outputs.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import InvalidArgumentError
from ..io import parse_size
from .calibration import get_calibration_data
from .checkpoint import save_quantized
from .config import GPTQConfig
from .estimate import cpu_cost_warning
from .gptq import HessianAccumulator, QuantResult, gptq_quantize, rtn_quantize
from .moe_experts import split_stacked_experts
from .model_utils import block_linears, check_causal_lm, decoder_layers, set_submodule
from .packing import pack_gptq
from .quant_linear import QuantLinear


class _StopForward(Exception):
    """Raised by the capture hook once the first block's inputs are recorded."""


@dataclass
class LayerStat:
    """Quantization error and time of one linear (or group of linears sharing one input)."""

    layer: int
    modules: str
    error: float
    seconds: float


class GPTQQuantizer:
    """Quantize a causal LM with GPTQ (`method="gptq"`) or round-to-nearest (`method="rtn"`).

    >>> quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=128))
    >>> model = quantizer.quantize(model, tokenizer)          # calibration text: config.dataset
    >>> quantizer.save_pretrained(model, "out/", tokenizer)
    """

    def __init__(self, config: GPTQConfig | None = None, method: str = "gptq", device: str | torch.device | None = None,
                 verbose: bool = True, **overrides: Any) -> None:
        base = config or GPTQConfig()
        self.config = base.replace(**overrides) if overrides else base
        if method not in ("gptq", "rtn"):
            raise InvalidArgumentError(f"method={method!r}; expected 'gptq' or 'rtn'.")
        self.method = method
        self.device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.verbose = verbose
        self.stats: list[LayerStat] = []
        self.seconds = 0.0

    # ----------------------------------------------------------------- public API
    @torch.no_grad()
    def quantize(self, model: nn.Module, tokenizer: Any = None, dataset: Any = None) -> nn.Module:
        """Quantize `model` in place and return it, with `model.config.quantization_config` set.

        `dataset` is anything `calibration.get_calibration_data` accepts (a name, a file, a list of
        strings, or a list of token-id tensors); None uses `config.dataset`. RTN ignores it.
        """
        check_causal_lm(model)
        cfg = self.config
        split_stacked_experts(model)  # MoE: quantize expert by expert (GPT-QModel's layout), not stacked tensors
        prefix, layers = decoder_layers(model)
        for i, layer in enumerate(layers):
            for name, lin in block_linears(layer, f"{prefix}.{i}", cfg.modules_to_not_convert).items():
                cfg.check_layer(f"{prefix}.{i}.{name}", lin.in_features)
        if cfg.lm_head:
            head_name, head = _output_head(model)
            cfg.check_layer(head_name, head.in_features)
        start = time.perf_counter()
        self.stats = []
        was_training = model.training
        model.eval()
        if self.method == "rtn":
            self._quantize_rtn(prefix, layers)
            if cfg.lm_head:
                self._quantize_head(model, None, len(layers))
        else:
            if dataset is None:
                dataset = cfg.dataset
            needs_tokenizer = not (isinstance(dataset, (list, tuple)) and dataset and isinstance(dataset[0], torch.Tensor))
            if needs_tokenizer and tokenizer is None:
                raise InvalidArgumentError("GPTQ needs a tokenizer to turn the calibration text into tokens; pass tokenizer=.")
            samples = get_calibration_data(dataset, tokenizer, cfg.n_samples, cfg.seqlen, cfg.seed)
            self._check_samples(model, samples)
            last = self._quantize_gptq(model, prefix, layers, samples)
            if cfg.lm_head:
                self._quantize_head(model, last, len(layers))
        model.config.quantization_config = cfg.to_quantization_config()
        model.train(was_training)
        self.seconds = time.perf_counter() - start
        if self.verbose:
            tqdm.write(self.summary())
        return model

    def save_pretrained(self, model: nn.Module, save_dir: str | os.PathLike, tokenizer: Any = None,
                        max_shard_size: str | int = "5GB", overwrite: bool = False):
        """Write the quantized model as a standard GPTQ checkpoint folder (atomically).

        `overwrite=True` replaces an earlier optimum-amdx output only, never a folder holding other files.
        To learn about a bad `save_dir` before a long `quantize`, call `optimum_amdx.io.check_output_dir` first.
        """
        parse_size(max_shard_size, "max_shard_size")
        return save_quantized(model, save_dir, tokenizer, max_shard_size, overwrite)

    def _check_samples(self, model: nn.Module, samples: list[torch.Tensor]) -> None:
        """Refuse empty calibration; warn past the model's context length and before a long CPU run."""
        if not samples or any(s.numel() == 0 for s in samples):
            raise InvalidArgumentError("The calibration data is empty; give at least one non-empty sample.")
        longest = max(s.shape[-1] for s in samples)
        context = getattr(model.config, "max_position_embeddings", None)
        if context and longest > context:
            warnings.warn(
                f"Calibration samples of {longest} tokens are longer than the model's context length ({context}); "
                f"its activations past position {context} are not what it was trained on. Use seqlen <= {context}.",
                stacklevel=3,
            )
        if self.device.type == "cpu":
            message = cpu_cost_warning(model, len(samples), longest)
            if message is not None:
                warnings.warn(message, stacklevel=3)

    def summary(self) -> str:
        """Per-layer error table (sum over the layer's linears, and the worst linear) and one total line."""
        if not self.stats:
            return "nothing quantized"
        by_layer: dict[int, list[LayerStat]] = {}
        for s in self.stats:
            by_layer.setdefault(s.layer, []).append(s)
        lines = [f"{'layer':>5}  {'total error':>12}  {'worst module':<28} {'error':>11}  {'s':>6}"]
        for layer, rows in by_layer.items():
            worst = max(rows, key=lambda r: r.error)
            lines.append(f"{layer:>5}  {sum(r.error for r in rows):>12.4g}  {worst.modules:<28} {worst.error:>11.4g}  "
                         f"{sum(r.seconds for r in rows):>6.2f}")
        total = sum(s.error for s in self.stats)
        lines.append(f"{self.method.upper()} {self.config.bits}-bit g{self.config.group_size}: {len(self.stats)} "
                     f"quantization steps over {len(by_layer)} layers, total error {total:.4g}, {self.seconds:.1f} s")
        return "\n".join(lines)

    # ----------------------------------------------------------------- RTN
    def _quantize_rtn(self, prefix: str, layers: nn.ModuleList) -> None:
        """Round-to-nearest, layer by layer. With `desc_act` there is no Hessian to order columns by: each
        layer's linears of one input width share a seeded random column order, which gives the act-order
        checkpoint layout (benchmarks measure its speed, `benchmark.backends`) at RTN's accuracy."""
        cfg = self.config
        for i, layer in enumerate(tqdm(layers, desc="RTN", disable=not self.verbose)):
            for name, lin in block_linears(layer, f"{prefix}.{i}", cfg.modules_to_not_convert).items():
                t0 = time.perf_counter()
                weight = lin.weight.to(self.device)
                order = None
                if cfg.desc_act:
                    k = lin.in_features
                    seed = cfg.seed * 1_000_003 + i * 65_537 + k
                    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
                res = rtn_quantize(weight, cfg, order)
                set_submodule(layer, name, self._to_quant_linear(lin, res))
                self.stats.append(LayerStat(i, name, res.error, time.perf_counter() - t0))

    # ----------------------------------------------------------------- GPTQ
    def _quantize_gptq(self, model: nn.Module, prefix: str, layers: nn.ModuleList,
                       samples: list[torch.Tensor]) -> list[torch.Tensor]:
        """GPTQ block by block; returns the last block's outputs per sample (the output head's input, before
        the final norm)."""
        cfg = self.config
        dev = self.device
        moved = _move_outside(model, prefix, dev)
        try:
            inputs = self._capture_inputs(model, layers, samples)
        finally:
            _restore(moved)
        bar = tqdm(range(len(layers)), desc="GPTQ", disable=not self.verbose)
        for i in bar:
            layer = layers[i]
            home = next(layer.parameters()).device
            layer.to(dev)
            linears = block_linears(layer, f"{prefix}.{i}", cfg.modules_to_not_convert)
            results: dict[str, QuantResult] = {}
            for step in self._steps(layer, linears, inputs):
                accs = {}
                hooks = []
                for group in step:
                    first = linears[group[0]]
                    acc = HessianAccumulator(first.in_features, dev)
                    accs[tuple(group)] = acc
                    hooks.append(first.register_forward_hook(_hessian_hook(acc)))
                # the rest of the block is not needed once the step's last linear has run
                hooks.append(linears[step[-1][-1]].register_forward_hook(_stop_hook))
                try:
                    for hs, kwargs in inputs:
                        try:
                            layer(hs, **kwargs)
                        except _StopForward:
                            pass
                finally:
                    for h in hooks:
                        h.remove()
                for group, acc in accs.items():
                    bar.set_postfix_str(f"{'+'.join(n.split('.')[-1] for n in group)}")
                    t0 = time.perf_counter()
                    weight = torch.cat([linears[n].weight for n in group], dim=0)
                    res = gptq_quantize(weight, acc.H, cfg)
                    del acc.H
                    row = 0
                    for n in group:
                        rows = linears[n].out_features
                        part = QuantResult(res.codes[row:row + rows], res.scales[:, row:row + rows],
                                           res.zeros[:, row:row + rows], res.g_idx,
                                           res.dequantized[row:row + rows], 0.0)
                        linears[n].weight.data.copy_(part.dequantized.to(linears[n].weight.dtype))
                        results[n] = part
                        row += rows
                    label = "+".join(n.split(".")[-1] for n in group)
                    self.stats.append(LayerStat(i, label, res.error, time.perf_counter() - t0))
            inputs = [(_first(layer(hs, **kwargs)), kwargs) for hs, kwargs in inputs]
            for n, res in results.items():
                set_submodule(layer, n, self._to_quant_linear(linears[n], res))
            layer.to(home)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        return [hs for hs, _ in inputs]

    # ----------------------------------------------------------------- output head
    def _quantize_head(self, model: nn.Module, hidden: list[torch.Tensor] | None, index: int) -> None:
        """Quantize the output head (`lm_head=True`): GPTQ with the Hessian of the final norm's output over
        the last block's outputs `hidden`, or RTN when `hidden` is None. A head tied to the input embeddings
        is untied (the embeddings keep their full-precision weight) and the config says so."""
        cfg = self.config
        name, head = _output_head(model)
        t0 = time.perf_counter()
        dev = self.device
        weight = head.weight.detach().to(dev)
        if hidden is None:
            res = rtn_quantize(weight, cfg)
        else:
            norm = getattr(model.get_decoder(), "norm", None)
            if not isinstance(norm, nn.Module):
                raise InvalidArgumentError(
                    f"{type(model).__name__} has no final norm at get_decoder().norm to take the output head's input "
                    "from; quantize it with lm_head=False (or method='rtn').")
            home = next(norm.parameters(), torch.empty(0)).device
            norm.to(dev)
            acc = HessianAccumulator(head.in_features, dev)
            try:
                for hs in hidden:
                    acc.add(norm(hs.to(dev)))
            finally:
                norm.to(home)
            res = gptq_quantize(weight, acc.H, cfg)
        tied = head.weight is model.get_input_embeddings().weight
        set_submodule(model, name, self._to_quant_linear(head, res))
        if tied:
            for conf in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
                conf.tie_word_embeddings = False
        self.stats.append(LayerStat(index, name, res.error, time.perf_counter() - t0))

    def _capture_inputs(self, model: nn.Module, layers: nn.ModuleList, samples: list[torch.Tensor]) -> list[tuple[torch.Tensor, dict]]:
        """Run each sample up to the first block; return (hidden_states, kwargs) per sample, on the device."""
        captured: list[tuple[torch.Tensor, dict]] = []
        first = layers[0]
        home = next(first.parameters()).device

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            kwargs = dict(kwargs)
            hs = args[0] if args else kwargs.pop("hidden_states")
            kwargs.pop("past_key_values", None)
            kwargs["use_cache"] = False
            captured.append((hs.detach(), kwargs))
            raise _StopForward

        handle = first.register_forward_pre_hook(hook, with_kwargs=True)
        first.to(self.device)
        try:
            for ids in samples:
                try:
                    model(input_ids=ids.to(self.device), use_cache=False)
                except _StopForward:
                    pass
        finally:
            handle.remove()
            first.to(home)
        return captured

    def _steps(self, layer: nn.Module, linears: dict[str, nn.Linear], inputs: list) -> list[list[list[str]]]:
        """Groups of linears that read the same input, in call order; one step per group when
        true_sequential, else all groups in one step."""
        order: list[tuple[str, torch.Tensor]] = []
        hooks = []
        for name, lin in linears.items():
            def rec(module: nn.Module, args: tuple, name: str = name) -> None:
                order.append((name, args[0]))  # holding the tensor keeps its identity unique
            hooks.append(lin.register_forward_pre_hook(rec))
        try:
            hs, kwargs = inputs[0]
            layer(hs, **kwargs)
        finally:
            for h in hooks:
                h.remove()
        groups: list[list[str]] = []
        last: torch.Tensor | None = None
        seen: set[str] = set()
        for name, x in order:
            if name in seen:
                continue
            seen.add(name)
            if groups and last is not None and x is last:
                groups[-1].append(name)
            else:
                groups.append([name])
            last = x
        order.clear()
        unseen = [n for n in linears if n not in seen]
        if unseen:
            raise InvalidArgumentError(f"Linears {unseen} of the block were not called in its forward; cannot collect their inputs.")
        return [[g] for g in groups] if self.config.true_sequential else [groups]

    def _to_quant_linear(self, linear: nn.Linear, res: QuantResult) -> QuantLinear:
        cfg = self.config
        packed = pack_gptq(res.codes, res.scales, res.zeros, res.g_idx, cfg.bits, cfg.checkpoint_format)
        home = linear.weight.device
        packed = {k: v.to(home) for k, v in packed.items()}
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return QuantLinear.from_packed(packed, linear.in_features, linear.out_features, cfg.bits, cfg.group_size,
                                       cfg.checkpoint_format, bias)


def _output_head(model: nn.Module) -> tuple[str, nn.Linear]:
    """The dotted name and module of the model's output head (an nn.Linear to quantize)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise InvalidArgumentError(
            f"lm_head=True quantizes the output head, but {type(model).__name__}'s is "
            f"{type(head).__name__ if head is not None else 'missing'}, not an nn.Linear.")
    name = next(n for n, m in model.named_modules() if m is head)
    return name, head


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _stop_hook(module: nn.Module, args: tuple, output: Any) -> None:
    raise _StopForward


def _hessian_hook(acc: HessianAccumulator) -> Callable:
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        acc.add(args[0].detach())
    return hook


def _move_outside(model: nn.Module, prefix: str, device: torch.device) -> list[tuple[torch.Tensor, torch.device]]:
    """Move every parameter/buffer outside the decoder blocks to `device`; return how to undo it."""
    moved = []
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, t in tensors:
        if name.startswith(prefix + ".") or t.device == device:
            continue
        moved.append((t, t.device))
        t.data = t.data.to(device)
    return moved


def _restore(moved: list[tuple[torch.Tensor, torch.device]]) -> None:
    for t, dev in moved:
        t.data = t.data.to(dev)
