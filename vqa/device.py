"""Devices and numeric precision: one place that picks where the model runs and in which dtype; and
`count_host_reads`, which counts the places where a program waits for the device."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from .errors import ConfigError


def pick_device(name: str | torch.device | None = "auto") -> torch.device:
    """`name` if given (cpu, cuda, cuda:1, mps), else CUDA, else Apple's MPS, else the CPU. A name that is no
    device, or a GPU this machine does not have, is a ConfigError naming it (before anything loads)."""
    if name is None or str(name) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"--device {name}: not a device; use cpu, cuda, cuda:N, mps or auto") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: no CUDA GPU is available here (torch.cuda.is_available() is "
                              "False); use --device cpu or auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"--device {name}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not _mps_available():
        raise ConfigError(f"--device {name}: Apple's MPS is not available here (torch.backends.mps.is_available() "
                          "is False); use --device cpu or auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name}: vqa runs on cpu, cuda, cuda:N or mps")
    return device


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `--precision` on `device` (None: float32, no autocast). `auto` is bf16 on GPUs
    with bf16 tensor cores (Ampere and newer), fp16 (with a GradScaler) on older GPUs, fp32 elsewhere:
    `is_bf16_supported()` alone also counts emulation, which is slower than fp32 on a V100 or T4."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def inference_dtype(device: torch.device) -> torch.dtype:
    """The weights' dtype a model answers in by default: bfloat16 on GPUs with bf16 tensor cores (half the bytes
    per decoded token, the tensor cores' rate), float32 elsewhere (a CPU's float32 matmuls are its fastest)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.bfloat16
    return torch.float32


def use_tensor_cores(device: torch.device) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA (Ampere and newer): what the parts autocast leaves
    in float32 (the loss, LayerNorms' statistics are unaffected) run on tensor cores at ~10 bits of mantissa
    instead of 23, the usual trade for training."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


__all__ = ["pick_device", "autocast_dtype", "inference_dtype", "use_tensor_cores", "count_host_reads"]


_READS = frozenset({torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__,
                    torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy})


class count_host_reads(TorchFunctionMode):  # noqa: N801 (used as a context manager, like torch's own modes)
    """`with count_host_reads() as c: ...` then `c.count` / `c.calls`: the calls inside that copy a tensor's values
    to the host (tolist, item, bool/float/int of a tensor, cpu, numpy, .to the CPU from a device). On CUDA each one
    makes the host wait for the device to finish everything queued; on a CPU they cost nothing, so they are
    counted here rather than timed. Copies to a device are not counted: they do not wait for it."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS or (func is torch.Tensor.to and _to_host(args, kwargs)):
            self.calls.append(func.__name__)
        return func(*args, **kwargs)

    @property
    def count(self) -> int:
        return len(self.calls)


def _to_host(args, kwargs) -> bool:
    """Whether Tensor.to(*args, **kwargs) copies a device tensor to the CPU."""
    src = args[0]
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            target = a
        elif torch.is_tensor(a):
            target = a.device
    return target is not None and torch.device(target).type == "cpu" and src.device.type != "cpu"
