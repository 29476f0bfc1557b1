"""`vqa train --shard fsdp`: the model sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`) under torchrun,
and the full (unsharded) weights and optimizer state that its checkpoints keep.

Each rank holds 1/world of every parameter, gradient and optimizer moment; a block's weights are gathered
just before it runs and freed after (forward and backward). Groups: every ViT block, every decoder block, the
cross-attention of each decoder block on its own (its image keys/values are projected before the blocks run:
`project_kv` is registered as a forward method), then the root: the `VQAModel` itself, whose forward is the
training loss (the patch embedding, token embeddings and tied head, final norms, the image projection).
Parameters stay float32 and autocast runs as with DDP, so a sharded step computes what a DDP step does. With
--accum every micro-batch's gradients are reduce-scattered as its backward ends (not only the last's, as DDP
does): skipping it would keep every rank's unsharded gradients, 4 bytes a parameter, between micro-batches.

Checkpoints are the unsharded run's: the full state dict gathered on rank 0 (`get_model_state_dict` with
`full_state_dict`), saved by `vqa.weights.checkpoint` from an unsharded copy of the model; the optimizer state
gathered the same way (`get_optimizer_state_dict`) and renumbered into `optimizer.state_dict()`'s layout, so a
run resumes with any world size and either --shard (`set_optimizer_state_dict` shards it again)."""

from __future__ import annotations

import dataclasses
import warnings
from itertools import chain

import torch
from torch import nn

from ..model import VQAModel
from ..weights import lora


def shard(model: VQAModel) -> VQAModel:
    """Apply fully_shard to `model` group by group, in place; returns it (now an FSDPModule as well).
    Build the optimizer after: the parameters become DTensors (new Parameter objects, the same names)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    # the cross-attention hands out views (its keys/values, its output), only ever read, never changed in place:
    # FSDP2's warning about in-place changes of a group's view outputs does not apply
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPAttention\) returned a view tensor")
    for group in groups(model):
        fully_shard(group)
        if hasattr(group, "project_kv"):  # memory_kv and the grounding probe call these outside the block's
            for method in ("project_kv", "weights_at"):  # forward: hooks of their own
                register_fsdp_forward_method(group, method)
    fully_shard(model)
    return model


def groups(model: VQAModel) -> list[nn.Module]:
    """The modules sharded as groups of their own, inner before outer: every ViT block, each decoder block's
    cross-attention, every decoder block (the llama layout's cross-attention blocks too); the root holds the rest."""
    out = list(model.vision.vit.blocks)
    dec = model.decoder
    for blk in [*dec.blocks, *getattr(dec, "cross", ())]:
        cross = getattr(blk, "cross_attn", None)
        out += [cross, blk] if cross is not None else [blk]
    return out


def gathered_parameters(model: VQAModel) -> int:
    """Parameters a rank holds in full at the peak of a sharded step: the root group's (gathered for the whole
    step) and the two largest groups' (the one running and the next, prefetched)."""
    sizes, seen = [], set()
    for g in groups(model):  # inner before outer: an inner group's parameters are its own, not the outer's
        inner = {id(p) for m in g.modules() if m is not g and id(m) in seen for p in m.parameters()}
        sizes.append(sum(p.numel() for p in g.parameters() if id(p) not in inner))
        seen.add(id(g))
    return model.num_parameters() - sum(sizes) + sum(sorted(sizes)[-2:])


def _options(everywhere: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload: the full tensors on rank 0's host only (the other ranks get an empty dict)
    return StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)


def plain_copy(model: VQAModel, everywhere: bool) -> VQAModel | None:
    """An unsharded VQAModel holding the sharded `model`'s full weights (its LoRA adapters and buffers too), in
    eval mode. A collective: every rank calls it. `everywhere`: on every rank, on its device (to evaluate);
    otherwise on rank 0's CPU (to save), None on the other ranks."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(everywhere))
    if not state:
        return None
    cfg = dataclasses.replace(model.cfg, vit_pretrained=False, vit_weights=None)  # the weights come from `state`
    with torch.device("meta"):  # the structure only: no memory until to_empty
        plain = VQAModel(cfg)
        settings = lora.adapter_settings(model)
        if settings is not None:
            lora.add_lora(plain, settings["rank"], settings["alpha"], tuple(settings["targets"]))
    # copies, not `assign`: the gathered tensors may share storage, which safetensors refuses to save
    plain.to_empty(device=next(iter(state.values())).device)
    plain.load_state_dict(state, strict=True)
    with torch.no_grad():
        for name, buf in model.named_buffers():  # non-persistent ones (sin-cos tables) are not in `state`
            plain.get_buffer(name).copy_(buf)
    plain.cfg = model.cfg  # the config.json a DDP run would write
    return plain.eval()


def _parts(optimizer) -> dict:
    """The torch optimizers inside `optimizer`, by their key in its state dict (None: it is one itself)."""
    if hasattr(optimizer, "parts"):  # vqa.train.optim.MuonAdamW
        return {"muon": optimizer.muon, "adamw": optimizer.adamw}
    return {None: optimizer}


def full_optimizer_state(root: nn.Module, optimizer) -> dict | None:
    """`optimizer.state_dict()` as one process training the unsharded model would write it (parameters numbered
    in group order, full tensors on the host): on rank 0; None on the others. A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    out: dict = {}
    for key, opt in _parts(optimizer).items():  # every part on every rank: each gather is a collective
        if opt is None:
            out[key] = None
            continue
        fqn_keyed = get_optimizer_state_dict(root, opt, options=_options(everywhere=False))
        if not fqn_keyed:  # not rank 0
            out[key] = None
            continue
        order = {fqn: i for i, fqn in enumerate(chain.from_iterable(g["params"] for g in fqn_keyed["param_groups"]))}
        out[key] = {"state": {order[fqn]: s for fqn, s in fqn_keyed["state"].items()},
                    "param_groups": [dict(g, params=[order[f] for f in g["params"]])
                                     for g in fqn_keyed["param_groups"]]}
    if torch.distributed.get_rank() != 0:  # sharded: under torchrun
        return None
    return out[None] if None in out else out


def load_optimizer_state(root: nn.Module, optimizer, saved: dict) -> None:
    """Load a state `full_optimizer_state` (or an unsharded run's `optimizer.state_dict()`) into the sharded
    `optimizer`: each rank keeps its shard. Every rank holds `saved` (each reads train_state.pt)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    parts = _parts(optimizer)
    if None not in parts and (not isinstance(saved, dict) or set(saved) != {"muon", "adamw"}):
        raise ValueError("the saved optimizer state is not Muon + AdamW "
                         "(was the run started with another --optimizer?)")
    names = {p: n for n, p in root.named_parameters()}
    for key, opt in parts.items():
        part = saved if key is None else saved[key]
        if (opt is None) != (part is None):
            raise ValueError("the saved Muon + AdamW state has other parameter groups than this model")
        if opt is None:
            continue
        sizes = [len(g["params"]) for g in opt.param_groups]
        if [len(g["params"]) for g in part["param_groups"]] != sizes:
            raise ValueError("the saved optimizer state has other parameter groups than this model")
        fqn = dict(zip(chain.from_iterable(g["params"] for g in part["param_groups"]),
                       (names[p] for g in opt.param_groups for p in g["params"]), strict=True))
        fqn_keyed = {"state": {fqn[i]: s for i, s in part["state"].items()},
                     "param_groups": [dict(g, params=[fqn[i] for i in g["params"]]) for g in part["param_groups"]]}
        set_optimizer_state_dict(root, opt, optim_state_dict=fqn_keyed, options=StateDictOptions(full_state_dict=True))


def is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def gathered(t: torch.Tensor) -> torch.Tensor:
    """The full tensor of a sharded one (an all-gather: every rank calls it), else `t` itself."""
    return t.full_tensor() if is_sharded(t) else t


def like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `full` (the same on every rank) laid out as the sharded `ref`: a slice, no traffic."""
    if not is_sharded(ref):
        return full
    from torch.distributed.tensor import DTensor, Replicate

    return DTensor.from_local(full, ref.device_mesh, [Replicate()], run_check=False).redistribute(
        ref.device_mesh, ref.placements)


__all__ = ["shard", "plain_copy", "full_optimizer_state", "load_optimizer_state", "gathered", "like",
           "is_sharded"]
