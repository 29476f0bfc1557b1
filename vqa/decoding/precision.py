"""How a model's weights are held for inference: their precision (float32, bfloat16, float16, or dynamic int8 on
CPUs through torchao) and, for a Predictor, whether decoding goes through the compiled step (`apply_run_policy`).

Defaults: bfloat16 on GPUs with bf16 tensor cores (Ampere and newer), float32 elsewhere, TF32 for float32
matmuls on CUDA; compiled on CUDA (where CUDA graphs replay a step) and with int8 (whose eager matmuls are
slower than float32's on a CPU). int8 where it cannot run warns and stays in float32.

int8 is torchao's `Int8DynamicActivationInt8WeightConfig`: every `nn.Linear` of the image encoder and the text
decoder keeps its weight as int8 with one float scale per output channel (a quarter of float32's bytes), and
each input row is quantized to int8 on the fly, so the matmul runs in integers (VNNI on x86 CPUs). Embeddings,
the tied LM head, LayerNorms and convolutions stay float32. Eagerly these int8 matmuls are slower than float32
on a CPU (torchao's eager path re-reads the weight to correct for the unsigned activations); compiled, with the
weights frozen in, they run oneDNN's int8 kernels -- which is what the compiled decode step does
(`vqa.decoding.compiled`, `Predictor(compile=True)`). Its accuracy against float32: docs/results/performance.md ("int8
accuracy", measured by `vqa eval --checkpoint RUN --data data/shapes --split val --method greedy --int8`).

torchao is the optional extra `vqa[int8]` (PyTorch's maintained quantization library; `torch.ao.quantization`
is deprecated). Where int8 cannot run -- no torchao, not a CPU, no quantized engine in this PyTorch build --
`int8_unavailable` says why and the model stays float32.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..device import inference_dtype, use_tensor_cores
from ..errors import ConfigError, InputError

PRECISIONS = ("float32", "bfloat16", "float16", "int8")
ACTIVATION_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                    "int8": torch.float32}  # int8 layers take and return float32 activations
_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
          "fp16": "float16"}


def precision_of(dtype: torch.dtype | str) -> str:
    """The precision name of a weights dtype (torch.bfloat16 or "bf16" -> "bfloat16"); InputError otherwise."""
    name = _NAMES.get(dtype) if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in ACTIVATION_DTYPE or name == "int8":
        raise InputError(f"dtype must be float32, bfloat16 or float16, not {dtype!r}")
    return name


def int8_unavailable(device: torch.device | str) -> str | None:
    """None if dynamic int8 can run on `device`; otherwise why not, in words."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"int8 inference is for CPUs, not {device.type} (on a GPU use bfloat16 weights instead)"
    engines = set(torch.backends.quantized.supported_engines) - {"none"}
    if not engines or not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no quantized CPU engine (oneDNN / x86 / qnnpack)"
    try:
        _import_torchao()
    except ImportError as e:
        return f"torchao is not installed ({e}); pip install 'vqa[int8]'"
    return None


def _import_torchao():
    # torchao registers a pytree type on import and torch logs a deprecation note about it: not the user's concern
    log = logging.getLogger("torch.utils._pytree")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    finally:
        log.setLevel(level)
    return Int8DynamicActivationInt8WeightConfig, quantize_


def quantize_int8(model: nn.Module) -> int:
    """Quantize every nn.Linear of `model` (in place) to dynamic int8; returns how many were quantized.
    Check `int8_unavailable` first. The model must be in eval mode: int8 weights do not train."""
    config_cls, quantize_ = _import_torchao()
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's notes on caching hashes of its tensor subclass
        # set_inductor_config=False: torchao would otherwise change torch._inductor settings for the whole process
        quantize_(model, config_cls(set_inductor_config=False), filter_fn=lambda m, _: type(m) is nn.Linear)
    return len(names)


def is_int8(model: nn.Module) -> bool:
    """Whether any linear layer of `model` holds an int8 weight (torchao's Int8Tensor)."""
    return any(type(m) is nn.Linear and type(m.weight).__name__ == "Int8Tensor" for m in model.modules())


def apply_precision(model: nn.Module, precision: str, device: torch.device) -> tuple[str, str | None]:
    """Put `model` (already on `device`, eval mode) in `precision`: float32 (unchanged), bfloat16 / float16
    (weights cast) or int8 (dynamic int8 linear layers, CPU). Returns (the precision it runs in, a notice for
    the user or None): int8 where it cannot run leaves the model in float32 and says why."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision in ("bfloat16", "float16"):
        model.to(ACTIVATION_DTYPE[precision])
        return precision, None
    if precision == "int8":
        reason = int8_unavailable(device)
        if reason is not None:
            return "float32", f"int8 is not available here: {reason}; running in float32"
        quantize_int8(model)
    return precision, None


@dataclass(frozen=True)
class RunPolicy:
    precision: str  # what the weights run in: float32, bfloat16, float16 or int8
    dtype: torch.dtype  # what the images go in as
    compile: bool  # decode through the torch.compile'd step
    notice: str | None  # why the precision asked for could not be used, or None


def apply_run_policy(model: nn.Module, device: torch.device, quantize: str | None = None,
                     dtype: torch.dtype | str | None = None, compile: bool | None = None) -> RunPolicy:
    """Put `model` (on `device`, eval mode) in the precision that `quantize` ("int8" or None) / `dtype` ask
    for (default: `vqa.device.inference_dtype`) and decide `compile` (None: the default above). InputError
    for an unknown quantization or for both quantize and dtype; a RuntimeWarning for int8 that cannot run."""
    if quantize not in (None, "int8"):
        raise InputError(f"quantize must be 'int8' or None, not {quantize!r}")
    if quantize is not None and dtype is not None:
        raise InputError("choose quantize='int8' (CPUs) or a dtype (GPUs), not both")
    if dtype is None and quantize is None:
        dtype = inference_dtype(device)
    asked = "int8" if quantize else precision_of(dtype if dtype is not None else torch.float32)
    use_tensor_cores(device)
    precision, notice = apply_precision(model, asked, device)
    if notice:
        warnings.warn(notice, RuntimeWarning, stacklevel=3)  # at the Predictor's caller
    compiled = (device.type == "cuda" or precision == "int8") if compile is None else bool(compile)
    return RunPolicy(precision, ACTIVATION_DTYPE[precision], compiled, notice)


__all__ = ["PRECISIONS", "ACTIVATION_DTYPE", "precision_of", "int8_unavailable", "quantize_int8", "is_int8",
           "apply_precision", "RunPolicy", "apply_run_policy"]
