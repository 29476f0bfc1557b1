"""LoRA (Hu et al., 2021): a frozen linear layer W plus a trained low-rank update, y = W x + b + (alpha / r) B A x,
with A [r, in] random and B [out, r] zero, so that an adapted model starts equal to its base.

Written here rather than taken from peft: peft's `get_peft_model` wraps the model in a PeftModel whose
parameter names gain `base_model.model.` and `.lora_A.default.` parts, which the optimizer's part rules, DDP,
the checkpoint layout and every loader of this package would have to learn; `LoRALinear` keeps the names of
the layer it adapts (`...qkv.weight`, `...qkv.bias`) and adds `...qkv.lora_A` / `...qkv.lora_B`.

A checkpoint keeps the base weights in model.safetensors as any other checkpoint, and the adapters beside it
(`adapter.safetensors`, `adapter_config.json`); `merge_lora` folds them into plain nn.Linear layers."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config.train import LORA_TARGETS, parse_targets
from ..errors import CheckpointError, ConfigError

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter.safetensors", "adapter_config.json"


class LoRALinear(nn.Linear):
    """An nn.Linear whose weight and bias are the base layer's (frozen by `add_lora`) plus `lora_A`, `lora_B`."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=w.device, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # peft's and the paper's initialisation
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=w.device, dtype=w.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale

    def base(self) -> nn.Linear:
        """A plain nn.Linear holding the same weight and bias Parameters (not copies)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight, lin.bias = self.weight, self.bias
        return lin

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain nn.Linear computing the same function: W + (alpha / r) B A."""
        lin = self.base()
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scale  # [out, r] @ [r, in] -> [out, in]
        lin.weight = nn.Parameter((self.weight.float() + delta).to(self.weight.dtype))
        if self.bias is not None:
            lin.bias = nn.Parameter(self.bias.detach().clone())
        return lin

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}"


def target_of(name: str) -> str | None:
    """The --lora-targets entry a linear layer `name` of a VQAModel belongs to, or None (the cross-attention,
    the image projection, anything outside the blocks: trained in full or as configured, never adapted)."""
    if name.startswith("vision.vit.blocks."):
        return "vit"
    if not name.startswith("decoder.blocks.") or ".cross" in name:
        return None
    return "mlp" if ".mlp." in name else "self_attn"


def add_lora(model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...]) -> list[str]:
    """Replace every nn.Linear of `targets` by a LoRALinear; returns the adapted layers' names."""
    if rank < 1:
        raise ConfigError(f"--lora-rank must be >= 1, got {rank}")
    found = [(n, m) for n, m in model.named_modules()
             if type(m) is nn.Linear and target_of(n) in targets]
    if not found:
        raise ConfigError(f"--lora-targets {','.join(targets)}: the model has no linear layer there")
    for name, module in found:
        _replace(model, name, LoRALinear(module, rank, alpha))
    return [n for n, _ in found]


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def adapter_settings(model: nn.Module) -> dict | None:
    """rank, alpha and targets of an adapted model (None without adapters)."""
    layers = lora_layers(model)
    if not layers:
        return None
    first = next(iter(layers.values()))
    targets = sorted({target_of(n) for n in layers}, key=LORA_TARGETS.index)
    return dict(rank=first.rank, alpha=first.alpha, targets=targets)


def freeze_base(model: nn.Module, frozen_part) -> None:
    """With adapters: every parameter that is not an adapter's stops training in the towers LoRA adapts (the
    language model always, the ViT when adapted); `frozen_part(name)` says which those are."""
    for name, p in model.named_parameters():
        if not name.endswith((".lora_A", ".lora_B")) and frozen_part(name):
            p.requires_grad_(False)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer: the model holds plain nn.Linear layers again (in place)."""
    for name, module in lora_layers(model).items():
        _replace(model, name, module.merged())
    return model


def remove_lora(model: nn.Module) -> nn.Module:
    """Put every adapted layer's base layer back, dropping its adapter (in place)."""
    for name, module in lora_layers(model).items():
        _replace(model, name, module.base())
    return model


@contextlib.contextmanager
def base_layers(model: nn.Module):
    """The model with its base layers in place of the adapted ones (the same Parameters), for saving the base
    weights under their own names; the adapters come back on exit."""
    layers = lora_layers(model)
    for name, module in layers.items():
        _replace(model, name, module.base())
    try:
        yield model
    finally:
        for name, module in layers.items():
            _replace(model, name, module)


def save_adapters(model: nn.Module, folder: Path) -> None:
    from safetensors.torch import save_file

    settings = adapter_settings(model)
    if settings is None:
        return
    tensors = {f"{n}.{k}": getattr(m, k).detach().contiguous().cpu()
               for n, m in lora_layers(model).items() for k in ("lora_A", "lora_B")}
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    (folder / ADAPTER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")


def load_adapters(model: nn.Module, folder: Path) -> bool:
    """Adapt `model` with the adapters saved in `folder`, if it holds any; True where it did."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cfg_path = folder / ADAPTER_CONFIG
    if not cfg_path.is_file():
        return False
    try:
        settings = json.loads(cfg_path.read_text())
        add_lora(model, int(settings["rank"]), float(settings["alpha"]), parse_targets(settings["targets"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, ConfigError) as e:
        raise CheckpointError(f"{cfg_path}: not an adapter config of rank, alpha and targets ({e})") from None
    try:
        tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: missing or not a complete safetensors file ({e})") from None
    params = {f"{n}.{k}": getattr(m, k) for n, m in lora_layers(model).items() for k in ("lora_A", "lora_B")}
    if set(tensors) != set(params):
        missing = sorted(set(params) - set(tensors))[:3] or sorted(set(tensors) - set(params))[:3]
        raise CheckpointError(f"{folder / ADAPTER_WEIGHTS} does not fit {cfg_path} (first differences: {missing})")
    with torch.no_grad():
        for key, p in params.items():
            if tensors[key].shape != p.shape:
                raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: {key} is {tuple(tensors[key].shape)}, "
                                      f"the model needs {tuple(p.shape)}")
            p.copy_(tensors[key])
    return True


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
