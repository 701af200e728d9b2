"""The runtimes a benchmark can measure, behind one small interface.

A backend turns a model source (a named random-weight shape or a local/bundled checkpoint) into a
`Runner`: a `generate(input_ids, attention_mask, new_tokens, streamer)` callable plus the facts the
roofline needs (weight bytes, KV element size). Backends whose code or runtime is missing report
themselves unavailable with the reason, so a benchmark of "whatever exists" still runs; naming a
missing backend explicitly is an error (see `harness`).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import InvalidArgumentError, UnsupportedModelError

QUANTIZATIONS = ("none", "gptq-4bit", "gptq-4bit-act-order", "gptq-4bit-lm-head")


@dataclass
class ModelSource:
    """What to benchmark: a named shape with seeded random weights, or a checkpoint folder."""

    name: str
    kind: str
    config: Any
    path: Path | None = None
    folder: Any = None
    """The loader's `ModelFolder` of a pretrained source (None for a shape)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.kind, "path": str(self.path) if self.path else None,
                "model_type": getattr(self.config, "model_type", None)}


def resolve_source(name: str, allow_pickle: bool = False) -> ModelSource:
    """A named shape (`optimum_amdx.models.shapes.SHAPES`), else anything `open_model` accepts."""
    from ..models import open_model
    from ..models.shapes import SHAPES, shape_config

    if name.strip().lower() in SHAPES:
        return ModelSource(name=name, kind="shape", config=shape_config(name))
    from transformers import AutoConfig

    folder = open_model(name, allow_pickle=allow_pickle)
    return ModelSource(name=name, kind="pretrained", config=AutoConfig.from_pretrained(folder.path), path=folder.path,
                       folder=folder)


@dataclass
class Runner:
    """A loaded model ready to generate, and the byte counts its roofline needs."""

    generate: Callable[..., Any]
    weight_bytes: float
    embedding_bytes: float
    tied_embeddings: bool
    kv_element_bytes: float
    non_embedding_params: float
    is_compiled: Callable[[], bool] = lambda: False
    notes: list[str] = field(default_factory=list)
    cleanup: Callable[[], None] = lambda: None
    inputs_on_host: bool = False
    """The backend's API takes prompt ids on the host (the paged engine schedules from host lists; ONNX
    Runtime is fed numpy): the harness makes its prompts there, before the clock starts, as it makes every
    other backend's on the device. Given device ids, such a backend would time a device-to-host copy (a
    sync) that no server holding tokenizer output makes."""

    def close(self) -> None:
        """Drop every reference to the model (closures included) and return its device memory."""
        import torch

        self.cleanup()
        self.generate = None  # type: ignore[assignment]
        self.is_compiled = lambda: False
        self.cleanup = lambda: None
        torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _tensor_bytes(module: Any) -> tuple[float, float, bool, float]:
    """(all weight bytes, input-embedding bytes, tied?, non-embedding parameter count) of a torch model."""
    seen: set[int] = set()
    total = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    emb = module.get_input_embeddings().weight
    out = module.get_output_embeddings()
    tied = out is not None and getattr(out, "weight", None) is not None and out.weight.data_ptr() == emb.data_ptr()
    emb_bytes = emb.numel() * emb.element_size()
    return float(total), float(emb_bytes), tied, float(_non_embedding_params(module))


def _non_embedding_params(module: Any) -> int:
    """Parameters that take part in every token's matmuls (the input embedding gather does not)."""
    emb = module.get_input_embeddings().weight
    count = 0
    seen: set[int] = set()
    for p in module.parameters():
        if p.data_ptr() in seen or p.data_ptr() == emb.data_ptr():
            continue
        seen.add(p.data_ptr())
        count += p.numel()
    out = module.get_output_embeddings()
    if out is not None and getattr(out, "weight", None) is not None and out.weight.data_ptr() == emb.data_ptr():
        count += emb.numel()
    for sub in module.modules():  # quantized linears keep their weights in buffers, not parameters
        if hasattr(sub, "qweight") and hasattr(sub, "in_features") and hasattr(sub, "out_features"):
            count += sub.in_features * sub.out_features
    return count


def build_torch_model(source: ModelSource, dtype: Any, device: str, seed: int) -> Any:
    """The transformers model of `source` in eval mode on `device`; shapes get seeded random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..models import load_causal_lm

    if source.kind == "shape":
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(source.config, dtype=dtype)
    else:
        model = load_causal_lm(source.folder or source.path, dtype=dtype, device=device)
    model.eval()
    if model.generation_config.pad_token_id is None:
        eos = model.generation_config.eos_token_id
        model.generation_config.pad_token_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    return model


def apply_quantization(model: Any, quantization: str, device: str) -> tuple[Any, list[str]]:
    """Replace the decoder's linear layers by 4-bit GPTQ-format ones when asked.

    The weights are round-to-nearest (group 128, no calibration data): the layers, storage and
    kernels are those of a real GPTQ checkpoint, so speed and memory are representative; accuracy
    is not measured here. "gptq-4bit-act-order" stores them in the act-order layout (groups over a
    permuted column order, `g_idx` not monotone), as `desc_act=True` checkpoints are; "gptq-4bit-lm-head"
    quantizes the output head too, as `lm_head=True` checkpoints do.
    """
    if quantization == "none":
        return model, []
    if quantization not in QUANTIZATIONS:
        raise InvalidArgumentError(f"Unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}.")
    from ..quantization import GPTQConfig, GPTQQuantizer

    cfg = model.config
    group = 128 if cfg.hidden_size % 128 == 0 and cfg.intermediate_size % 128 == 0 else 32
    act_order = quantization == "gptq-4bit-act-order"
    head = quantization == "gptq-4bit-lm-head"
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=group, desc_act=act_order, lm_head=head), method="rtn",
                              device=device, verbose=False)
    model = quantizer.quantize(model)
    gc.collect()
    layout = ", act-order layout (seeded column order)" if act_order else ", output head too" if head else ""
    return model, [f"{quantization}: RTN-quantized 4-bit group-{group} weights{layout} "
                   "(speed and memory, not accuracy)"]


def _runner_from_torch(model: Any, generate: Callable[..., Any], notes: list[str]) -> Runner:
    total, emb, tied, non_emb = _tensor_bytes(model)
    kv_bytes = float(next(p for p in model.parameters() if p.is_floating_point()).element_size())

    def cleanup() -> None:
        nonlocal model
        model = None

    return Runner(
        generate=generate,
        weight_bytes=total,
        embedding_bytes=emb,
        tied_embeddings=tied,
        kv_element_bytes=kv_bytes,
        non_embedding_params=non_emb,
        is_compiled=lambda: model is not None and getattr(model, "_compiled_call", None) is not None,
        notes=notes,
        cleanup=cleanup,
    )


@dataclass(frozen=True)
class LoadSizes:
    """The largest batch, prompt and total length a loaded runner will see (engines size pools by it)."""

    max_batch: int
    max_prompt: int
    max_total: int


class Backend:
    """Base class: a name, a one-line summary, an availability check and a loader."""

    name = ""
    summary = ""

    def availability(self, device: str) -> tuple[bool, str]:
        """(available, reason) on `device`."""
        return True, ""

    def load(self, source: ModelSource, dtype: Any, quantization: str, device: str, seed: int,
             sizes: "LoadSizes") -> Runner:
        """Build the model for `device`; `sizes` bounds the batches and lengths it will be asked for."""
        raise NotImplementedError


class TransformersBackend(Backend):
    """transformers `generate()` with the dynamic (eager) KV cache."""

    name = "transformers"
    summary = "transformers eager, dynamic KV cache"
    cache_implementation: str | None = None

    def _generate_kwargs(self) -> dict[str, Any]:
        return {} if self.cache_implementation is None else {"cache_implementation": self.cache_implementation}

    def load(self, source: ModelSource, dtype: Any, quantization: str, device: str, seed: int,
             sizes: "LoadSizes") -> Runner:
        model = build_torch_model(source, dtype, device, seed)
        model, notes = apply_quantization(model, quantization, device)
        extra = self._generate_kwargs()
        if self.cache_implementation == "static" and not device.startswith("cuda"):
            notes.append("transformers compiles static-cache decoding on GPUs only: on the CPU this runs uncompiled")

        def generate(input_ids: Any, attention_mask: Any, new_tokens: int, streamer: Any) -> Any:
            import torch

            with torch.inference_mode():
                return model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    streamer=streamer,
                    **extra,
                )

        return _runner_from_torch(model, generate, notes)


class TransformersCompileBackend(TransformersBackend):
    """transformers `generate()` with a static KV cache, which auto-compiles the decode step on GPUs."""

    name = "transformers-compile"
    summary = "transformers static KV cache + torch.compile"
    cache_implementation = "static"


class RocmBackend(Backend):
    """optimum-amdx's own runtime: `AMDModelForCausalLM` (AMD kernels, paged KV cache, graph-captured decode).

    The batch goes through the continuous-batching engine directly (one request per row, greedy,
    no stop tokens, exactly `new_tokens` each), with a clock mark after every engine step in which
    each request has produced one more token: the first such mark is the time to first token of the
    whole batch, the others are decode steps.
    """

    name = "rocm"
    summary = "optimum-amdx AMDModelForCausalLM (paged KV cache, graph-captured decode)"

    def availability(self, device: str) -> tuple[bool, str]:
        if importlib.util.find_spec("optimum_amdx.modeling") is None:
            return False, "optimum_amdx.modeling is not installed"
        try:
            module = importlib.import_module("optimum_amdx.modeling")
            getattr(module, "AMDModelForCausalLM")
        except (ImportError, AttributeError) as err:
            return False, f"optimum_amdx.modeling.AMDModelForCausalLM is unusable: {err}"
        return True, ""

    def load(self, source: ModelSource, dtype: Any, quantization: str, device: str, seed: int,
             sizes: "LoadSizes") -> Runner:
        from ..modeling import AMDModelForCausalLM
        from ..modeling.sampling import SamplingParams

        model = build_torch_model(source, dtype, device, seed)
        model, notes = apply_quantization(model, quantization, device)
        amd = AMDModelForCausalLM(model, max_num_seqs=sizes.max_batch,
                                  max_num_batched_tokens=max(4096, sizes.max_batch * sizes.max_prompt),
                                  max_model_len=sizes.max_total)
        if device.startswith("cuda"):
            notes.append("the engine preallocates its paged KV pool from free GPU memory: peak memory includes it")

        def generate(input_ids: Any, attention_mask: Any, new_tokens: int, streamer: Any) -> Any:
            import torch

            engine = amd.engine
            params = SamplingParams(max_new_tokens=new_tokens, do_sample=False, stop_token_ids=())
            host = input_ids.cpu()  # one device-to-host copy for both uses (each is a sync on the TTFT path)
            rows = host.tolist()
            if streamer is not None:
                streamer.put(host)
            counts = {engine.add_request(row, params): 0 for row in rows}
            marked = 0
            with torch.inference_mode():
                while engine.has_unfinished():
                    for out in engine.step():
                        counts[out.request_id] += len(out.new_token_ids)
                    while streamer is not None and marked < min(counts.values()):
                        streamer.put(None)
                        marked += 1
            done = engine.run()
            return [done[rid] for rid in counts]

        runner = _runner_from_torch(model, generate, notes)
        drop_model = runner.cleanup

        def cleanup() -> None:
            nonlocal amd, model
            amd = model = None
            drop_model()

        runner.is_compiled = lambda: amd is not None and amd._engine is not None and bool(amd.engine.uses_graphs)
        runner.cleanup = cleanup
        runner.inputs_on_host = True
        return runner


class OrtBackend(Backend):
    """ONNX Runtime through `optimum_amdx.onnxruntime.ORTModelForCausalLM` (exported on the fly)."""

    name = "ort"
    summary = "ONNX Runtime ORTModelForCausalLM (export on the fly)"

    def availability(self, device: str) -> tuple[bool, str]:
        if importlib.util.find_spec("onnxruntime") is None:
            return False, "onnxruntime is not installed (pip install 'optimum-amdx[onnx]')"
        try:
            module = importlib.import_module("optimum_amdx.onnxruntime")
        except ImportError as err:
            return False, f"optimum_amdx.onnxruntime failed to import: {err}"
        if not hasattr(module, "ORTModelForCausalLM"):
            return False, "optimum_amdx.onnxruntime has no ORTModelForCausalLM yet"
        return True, ""

    def load(self, source: ModelSource, dtype: Any, quantization: str, device: str, seed: int,
             sizes: "LoadSizes") -> Runner:
        import torch

        from ..onnxruntime import ORTModelForCausalLM

        if quantization != "none":
            raise UnsupportedModelError("The ort backend benchmarks unquantized exports only; use --quantization none.")
        tmp = Path(tempfile.mkdtemp(prefix="amdx-bench-ort-"))
        notes: list[str] = []
        try:
            if source.kind == "shape":
                cpu_model = build_torch_model(source, torch.float32, "cpu", seed)
                cpu_model.save_pretrained(tmp / "model")
                model_dir = tmp / "model"
                del cpu_model
            else:
                model_dir = source.path
            cache = tmp / "onnx" if source.kind == "shape" else None
            export_dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
            ort_model = ORTModelForCausalLM.from_pretrained(model_dir, export=True, cache_dir=cache,
                                                            export_kwargs={"dtype": export_dtype})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        providers = getattr(ort_model, "providers", None)
        if providers:
            notes.append(f"ONNX Runtime providers in use: {', '.join(providers)}")
        element = float(torch.empty((), dtype=dtype).element_size())
        total, emb, tied, non_emb = _geometry_bytes(source, element)

        def generate(input_ids: Any, attention_mask: Any, new_tokens: int, streamer: Any) -> Any:
            return ort_model.generate(input_ids=input_ids.cpu(), attention_mask=attention_mask.cpu(),
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False, streamer=streamer)

        return Runner(generate=generate, weight_bytes=total, embedding_bytes=emb, tied_embeddings=tied,
                      kv_element_bytes=element, non_embedding_params=non_emb, notes=notes,
                      cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True), inputs_on_host=True)


def _geometry_bytes(source: ModelSource, element_bytes: float) -> tuple[float, float, bool, float]:
    """Byte counts of an exported graph's weights, from the config's parameter count."""
    from ..models.shapes import parameter_count

    cfg = source.config
    params = parameter_count(cfg)
    emb = cfg.vocab_size * cfg.hidden_size
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    non_emb = params - emb + (emb if tied else 0)
    return element_bytes * params, element_bytes * emb, tied, float(non_emb)


BACKENDS: dict[str, Backend] = {
    b.name: b for b in (TransformersBackend(), TransformersCompileBackend(), RocmBackend(), OrtBackend())
}


def get_backend(name: str) -> Backend:
    """The backend called `name`, or a clear error listing the known ones."""
    key = name.strip().lower()
    if key not in BACKENDS:
        raise InvalidArgumentError(f"Unknown backend {name!r}; choose from {', '.join(BACKENDS)}.")
    return BACKENDS[key]
