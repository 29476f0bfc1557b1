"""The optimizers and the schedule: AdamW with weight decay on matrices only (nanoGPT's rule), or Muon for the
hidden matrices with AdamW for the rest; a learning rate per part of the model (the new cross-attention, the
decoder, the vision encoder; a part at rate 0, or left out of --train-only, is frozen); the schedule: linear
warmup then cosine, or Noam's (the Transformer paper's inverse square root after a linear warmup)."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from ..config import PARTS
from ..errors import ConfigError
from .sharding import gathered, like

OPTIMIZERS = ("adamw", "muon")
# Muon's learning rate = this x --lr. Its update is RMS-matched to AdamW's (0.2 sqrt(max(rows, cols))), so a
# Muon step moves a matrix ~this x as far as AdamW would at --lr, and the decoupled weight decay (lr x wd) of
# those matrices is this x stronger per step too. TrainConfig.muon_lr_scale; how 10 was chosen:
# docs/results/training-results.md
MUON_LR_SCALE = 10.0
NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)  # the quintic Newton-Schulz iteration of Jordan et al. (and torch)
# the gpt layout's cross-attention sits in every block; the llama layout's in blocks of their own
_CROSS = re.compile(r"decoder\.(blocks\.\d+\.(cross_attn|ln2)|cross)\.")


def part_of(name: str) -> str:
    """The part (`vqa.config.PARTS`) of the VQAModel parameter `name`: "encoder" (the timm ViT),
    "cross_attention" (what joins the towers: every decoder block's cross-attention and its LayerNorm, or
    the llama layout's gated cross-attention blocks, and the projection of the image tokens to the decoder's
    width) or "decoder" (the rest of the decoder: token and position embeddings, self-attention, MLP,
    LayerNorms, the tied LM head)."""
    if name.startswith("vision.vit."):
        return "encoder"
    if name.startswith("vision.") or _CROSS.match(name):
        return "cross_attention"
    return "decoder"


def param_groups(model: nn.Module, lr: float, vit_lr: float, weight_decay: float, muon: bool = False,
                 dec_lr: float | None = None, frozen: tuple[str, ...] = (),
                 muon_scale: float = MUON_LR_SCALE) -> list[dict]:
    """Groups {text side, vision encoder} x {decay (2-D and up), no decay (biases, norms, 1-D)}, plus, with
    `muon`, x the weights of every nn.Linear (attention and MLP matrices; marked "muon": True, at
    `muon_scale` x the lr). Embeddings, the conv stem and the tied LM head stay with AdamW. Position
    embeddings and the CLS token of the ViT are not decayed.

    Rates: `lr` for the cross-attention (`part_of`), `dec_lr` (default `lr`) for the rest of the decoder,
    `vit_lr` for the encoder; where `dec_lr` differs from `lr` the text side splits into a cross-attention
    and a decoder group (else one group, as before the split, so older runs resume). The encoder or the
    decoder at rate 0 is frozen (requires_grad False: no gradients computed), as is every part in `frozen`."""
    bad = sorted(set(frozen) - set(PARTS))
    if bad:
        raise ValueError(f"unknown part(s) {bad}; the parts are {', '.join(PARTS)}")
    rates = {"cross_attention": lr, "decoder": lr if dec_lr is None else dec_lr, "encoder": vit_lr}
    frozen = set(frozen) | {p for p in ("decoder", "encoder") if rates[p] == 0}
    split = rates["decoder"] != rates["cross_attention"]
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} if muon else set()
    sides = ("text", "cross_attention", "decoder", "encoder")
    groups: dict[tuple[str, str], list] = {(s, k): [] for s in sides for k in ("muon", "decay", "no_decay")}
    for name, p in model.named_parameters():
        part = part_of(name)
        if part in frozen:
            p.requires_grad_(False)
        if not p.requires_grad:
            continue
        side = part if part == "encoder" or split else "text"
        no_decay = p.ndim < 2 or name.endswith(("pos_embed", "cls_token", "reg_token")) or "pos.weight" in name
        kind = "muon" if id(p) in linear else "no_decay" if no_decay else "decay"
        groups[(side, kind)].append(p)
    out = []
    for (side, kind), params in groups.items():
        if params:
            base = rates["cross_attention" if side == "text" else side] * (muon_scale if kind == "muon" else 1.0)
            out.append(dict(params=params, lr=base, base_lr=base, muon=kind == "muon", part=side,
                            weight_decay=0.0 if kind == "no_decay" else weight_decay))
    if not out:
        raise ConfigError("every part of the model is frozen: nothing to train (see --train-only and the rates)")
    return out


def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32,
                  eps: float = 1e-7) -> torch.Tensor:
    """~U V^T of g = U S V^T by the quintic Newton-Schulz iteration (torch.optim.Muon's, in `dtype`)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T  # iterate on the wide side: X X^T is the smaller Gram matrix
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024): SGD momentum whose update is orthogonalized, for 2-D weight matrices.
    The update of torch.optim.Muon(adjust_lr_fn="match_rms_adamw"): Nesterov momentum, Newton-Schulz, the
    step scaled by 0.2 sqrt(max(rows, cols)) so its RMS matches AdamW's, decoupled weight decay. Written out
    because torch's runs Newton-Schulz in bfloat16, which made a tiny-preset step on CPU twice as slow; here
    it is float32 unless `ns_dtype` says otherwise (bfloat16 on CUDA)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.0, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, ns_dtype: torch.dtype | None = None):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps))
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D matrices only, got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mom = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mom)
                update = p.grad.lerp(buf, mom) if group["nesterov"] else buf
                dtype = self.ns_dtype or (torch.bfloat16 if p.is_cuda else torch.float32)
                # Newton-Schulz needs the whole matrix: a sharded one (--shard fsdp) is gathered, each rank
                # orthogonalizes it and keeps its own rows
                update = like(orthogonalize(gathered(update), group["ns_steps"], dtype), p)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * (0.2 * math.sqrt(max(p.shape))))  # as torch rounds it
        return loss


class MuonAdamW:
    """Muon for the groups marked "muon", AdamW for the others, stepped as one optimizer: `param_groups`
    lists both (the schedule sets each group's lr from its base_lr; GradScaler unscales them all), and the
    state dict holds both."""

    def __init__(self, groups: list[dict], betas=(0.9, 0.98), eps: float = 1e-8, fused: bool | None = None):
        muon = [g for g in groups if g.get("muon")]
        rest = [g for g in groups if not g.get("muon")]
        self.muon = Muon(muon) if muon else None
        self.adamw = torch.optim.AdamW(rest, betas=betas, eps=eps, fused=fused) if rest else None
        self.parts = [o for o in (self.adamw, self.muon) if o is not None]  # AdamW's first group: the logged lr

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.parts for g in o.param_groups]

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for o in self.parts:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": None if self.muon is None else self.muon.state_dict(),
                "adamw": None if self.adamw is None else self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError("the saved optimizer state is not Muon + AdamW "
                             "(was the run started with another --optimizer?)")
        for o, s in ((self.muon, state["muon"]), (self.adamw, state["adamw"])):
            if (o is None) != (s is None):
                raise ValueError("the saved Muon + AdamW state has other parameter groups than this model")
            if o is not None:
                o.load_state_dict(s)


def make_optimizer(model, lr, vit_lr, weight_decay, fused: bool = False, kind: str = "adamw",
                   dec_lr: float | None = None, frozen: tuple[str, ...] = (), muon_scale: float = MUON_LR_SCALE):
    """`kind` "adamw": torch's AdamW over all groups; "muon": MuonAdamW (Muon for nn.Linear weights).
    Rates and freezing: `param_groups`."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; choose one of: {', '.join(OPTIMIZERS)}")
    groups = param_groups(model, lr, vit_lr, weight_decay, muon=kind == "muon", dec_lr=dec_lr, frozen=frozen,
                          muon_scale=muon_scale)
    if kind == "muon":
        return MuonAdamW(groups, fused=fused or None)
    return torch.optim.AdamW(groups, betas=(0.9, 0.98), eps=1e-8, fused=fused or None)


SCHEDULES = ("cosine", "noam")


def noam(step: int, warmup: int, d_model: int) -> float:
    """The Transformer paper's learning rate at `step` (counted from 1): d_model^-0.5 * min(step^-0.5,
    step * warmup^-1.5): a linear rise to its peak (d_model * warmup)^-0.5 at step = warmup, then 1/sqrt(step)."""
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = 0.1, schedule: str = "cosine") -> float:
    """The factor on each group's base rate at `step` (from 0). cosine: linear warmup from 0 to 1 over `warmup`
    steps, then cosine from 1 to `min_ratio` at `total`. noam: `noam` divided by its peak, so that --lr is the
    peak rate as in cosine and the parts keep their ratios (d_model^-0.5 cancels: --lr plays its part); it
    never ends, so it suits a run whose length is open."""
    if schedule == "noam":
        w = max(1, warmup)
        return noam(step + 1, w, 1) / noam(w, w, 1)
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}")
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer, factor: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]
