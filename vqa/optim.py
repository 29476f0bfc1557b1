"""The optimizers and the schedule: AdamW with weight decay on matrices only (nanoGPT's rule), or Muon for the
hidden matrices with AdamW for the rest; a separate learning rate for the vision encoder; linear warmup, then
cosine."""

from __future__ import annotations

import math

import torch
from torch import nn

OPTIMIZERS = ("adamw", "muon")
# Muon's learning rate = this x --lr. Its update is RMS-matched to AdamW's (0.2 sqrt(max(rows, cols))), so a
# Muon step moves a matrix ~this x as far as AdamW would at --lr, and the decoupled weight decay (lr x wd) of
# those matrices is this x stronger per step too. TrainConfig.muon_lr_scale; values tried: docs/shapes-10min.md
MUON_LR_SCALE = 10.0
NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)  # the quintic Newton-Schulz iteration of Jordan et al. (and torch)


def param_groups(model: nn.Module, lr: float, vit_lr: float, weight_decay: float, muon: bool = False,
                 muon_scale: float = MUON_LR_SCALE) -> list[dict]:
    """Groups {decoder, vision} x {decay (2-D and up), no decay (biases, norms, 1-D)}, plus, with `muon`,
    {decoder, vision} x the weights of every nn.Linear (attention and MLP matrices; marked "muon": True, at
    `muon_scale` x the lr). Embeddings, the conv stem and the tied LM head stay with AdamW. Position
    embeddings and the CLS token of the ViT are not decayed. vit_lr = 0 freezes the encoder."""
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} if muon else set()
    groups: dict[tuple[bool, str], list] = {(v, k): [] for v in (False, True) for k in ("muon", "decay", "no_decay")}
    for name, p in model.named_parameters():
        is_vit = name.startswith("vision.vit.")
        if is_vit and vit_lr == 0:
            p.requires_grad_(False)
        if not p.requires_grad:
            continue
        no_decay = p.ndim < 2 or name.endswith(("pos_embed", "cls_token", "reg_token")) or "pos.weight" in name
        kind = "muon" if id(p) in linear else "no_decay" if no_decay else "decay"
        groups[(is_vit, kind)].append(p)
    out = []
    for (is_vit, kind), params in groups.items():
        if params:
            base = (vit_lr if is_vit else lr) * (muon_scale if kind == "muon" else 1.0)
            out.append(dict(params=params, lr=base, base_lr=base, muon=kind == "muon",
                            weight_decay=0.0 if kind == "no_decay" else weight_decay))
    return out


def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32, eps: float = 1e-7) -> torch.Tensor:
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
                update = orthogonalize(update, group["ns_steps"], dtype)
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
            raise ValueError("the saved optimizer state is not Muon + AdamW (was the run started with another --optimizer?)")
        for o, s in ((self.muon, state["muon"]), (self.adamw, state["adamw"])):
            if (o is None) != (s is None):
                raise ValueError("the saved Muon + AdamW state has other parameter groups than this model")
            if o is not None:
                o.load_state_dict(s)


def make_optimizer(model, lr, vit_lr, weight_decay, fused: bool = False, kind: str = "adamw",
                   muon_scale: float = MUON_LR_SCALE):
    """`kind` "adamw": torch's AdamW over all groups; "muon": MuonAdamW (Muon for nn.Linear weights)."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; choose one of: {', '.join(OPTIMIZERS)}")
    groups = param_groups(model, lr, vit_lr, weight_decay, muon=kind == "muon", muon_scale=muon_scale)
    if kind == "muon":
        return MuonAdamW(groups, fused=fused or None)
    return torch.optim.AdamW(groups, betas=(0.9, 0.98), eps=1e-8, fused=fused or None)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warmup from 0 to 1 over `warmup` steps, then cosine from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer, factor: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]
