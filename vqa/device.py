"""Devices and numeric precision: one place that picks where the model runs and in which dtype."""

from __future__ import annotations

import torch


def pick_device(name: str | torch.device | None = "auto") -> torch.device:
    """`name` if given (cpu, cuda, cuda:1, mps), else CUDA, else Apple's MPS, else the CPU."""
    if name is not None and str(name) != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `--precision` on `device` (None: float32, no autocast). `auto` is bf16 on GPUs
    with bf16 tensor cores (Ampere and newer), fp16 (with a GradScaler) on older GPUs, fp32 elsewhere:
    `is_bf16_supported()` alone also counts emulation, which is slower than fp32 on a V100 or T4."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def use_tensor_cores(device: torch.device) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA (Ampere and newer): what the parts autocast leaves
    in float32 (the loss, LayerNorms' statistics are unaffected) run on tensor cores at ~10 bits of mantissa
    instead of 23, the usual trade for training."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


__all__ = ["pick_device", "autocast_dtype", "use_tensor_cores"]
