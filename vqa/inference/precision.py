"""How a Predictor runs its model: the weights' precision and whether decoding goes through the compiled step.

Defaults: bfloat16 on GPUs with bf16 tensor cores (Ampere and newer), float32 elsewhere, TF32 for float32
matmuls on CUDA; compiled on CUDA (where CUDA graphs replay a step) and with int8 (whose eager matmuls are
slower than float32's on a CPU). int8 where it cannot run warns and stays in float32.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..decoding.quantize import ACTIVATION_DTYPE, apply_precision, precision_of
from ..device import inference_dtype, use_tensor_cores
from ..errors import InputError


@dataclass(frozen=True)
class RunPolicy:
    precision: str  # what the weights run in: float32, bfloat16, float16 or int8
    dtype: torch.dtype  # what the images go in as
    compile: bool  # decode through the torch.compile'd step
    notice: str | None  # why the precision asked for could not be used, or None


def apply_run_policy(model: torch.nn.Module, device: torch.device, quantize: str | None = None,
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


__all__ = ["RunPolicy", "apply_run_policy"]
