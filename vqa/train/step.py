"""One optimizer step, as `vqa train` runs it (and `scripts/bench.py` times it): forward and backward over the
micro-batches (`model(images, rows)`: `VQAModel.forward` returns the loss), the step's scalars in one
all-reduce, gradients scaled to the global mean, clip, step.

The step never makes the host wait for the device: weighted target counts come from the collate function (CPU),
the loss stays on the device, and the gradient scale is a device tensor. The caller reads the returned
scalars only when it logs. `count_syncs` checks it: it counts the operations that would block the host on
CUDA (`.item()`, `nonzero`, boolean-mask indexing, ...).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..data.collate import ImageTextBatch
from ..model import VQAModel
from ..model.packed import PackedRows

# aten ops that copy a value to the host or size an output by data: each makes the host wait on CUDA
SYNCING_OPS = frozenset({
    "_local_scalar_dense", "nonzero", "masked_select", "masked_scatter", "equal", "is_nonzero", "unique",
    "_unique", "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave", "bincount", "histc",
    "_assert_async",
})


def wrap_ddp(model: VQAModel, device: torch.device, local_rank: int = 0, static_graph: bool = True):
    """The model under DDP as training runs it (its forward is the training loss). Buffers (sin-cos tables)
    are constants: nothing to broadcast every forward. Gradients are views of DDP's buckets: no second copy
    of them. The step's graph is static (every trainable parameter gets a gradient in every step, the
    batch without text included, and each micro-batch runs the same forward), so `static_graph` lets DDP skip
    re-deciding what took part and which buckets are ready."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, broadcast_buffers=False,
               gradient_as_bucket_view=True, static_graph=static_graph)


# the step's stats tensor, summed over ranks: [summed loss, weighted target count, *the caller's extra values]
LOSS_SUM, TARGETS, EXTRA = 0, 1, slice(2, None)


@dataclass(frozen=True)
class StepStats:
    """A step's scalars on the host, summed over ranks: what `StepRunner` returns, read (the one sync)."""

    loss_sum: float  # the summed loss of every target token of the global batch
    targets: float  # their weighted count
    extra: tuple[float, ...]  # the caller's values (the time-limit proposals)

    @classmethod
    def read(cls, stats: torch.Tensor) -> StepStats:
        """From [summed loss, weighted target count, *extra]; waits for the device."""
        values = stats.tolist()
        return cls(values[LOSS_SUM], values[TARGETS], tuple(values[EXTRA]))

    @property
    def loss(self) -> float:
        """The global batch's mean loss per target token."""
        return self.loss_sum / max(self.targets, 1.0)


class StepRunner:
    def __init__(self, fwd: Callable[[torch.Tensor, PackedRows], torch.Tensor], optimizer,
                 scaler: torch.amp.GradScaler, params: list[torch.Tensor], device: torch.device,
                 grad_clip: float = 1.0, amp_dtype: torch.dtype | None = None, world: int = 1, ddp=None,
                 normalize: Callable | None = None):
        """`fwd`: the model, whose call `fwd(images, rows)` returns the loss (under DDP or FSDP, and
        torch.compile, as training asks). `normalize(images, jitter, device)`: a batch's uint8 images (and
        jitter) to the model's input on the device (`vqa.data.transforms.ImageNormalizer`); None: the images
        as they are."""
        self.fwd, self.optimizer, self.scaler, self.params = fwd, optimizer, scaler, params
        self.device, self.grad_clip = device, float(grad_clip)
        self.amp_dtype, self.world, self.ddp = amp_dtype, int(world), ddp
        self.ddp_started = False  # a backward through DDP has run
        self.normalize = normalize

    def __call__(self, micro: list[ImageTextBatch], extra: Iterable[float] = ()) -> torch.Tensor:
        """Returns, without waiting for the device, [summed loss, weighted target count, *extra] summed over
        ranks: `extra` carries host values every rank must agree on (the time-limit decisions)."""
        dev = self.device
        n_local = sum(b.packed.weighted_targets for b in micro)
        loss_sum = torch.zeros((), device=dev)
        for i, b in enumerate(micro):
            if self.ddp is not None:  # sync gradients on the last micro-batch only (as nanoGPT does), and on the
                # very first backward: DDP's static graph is recorded there and fails under no_sync (syncing a
                # micro-batch early is the same sum: the ranks' mean is linear)
                self.ddp.require_backward_grad_sync = i == len(micro) - 1 or not self.ddp_started
                self.ddp_started = True
            images = (b.images.to(dev, non_blocking=True) if self.normalize is None
                      else self.normalize(b.images, b.jitter, dev))
            rows = b.packed.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
                part = self.fwd(images, rows)
            loss_sum += part.detach()
            self.scaler.scale(part).backward()
        host = torch.tensor([n_local, *extra], dtype=torch.float32)
        stats = torch.cat([loss_sum.float().view(1),
                           host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host])
        if self.world > 1:
            torch.distributed.all_reduce(stats)  # the step's one collective besides the gradients'
        self.scaler.unscale_(self.optimizer)
        # gradients are of the summed loss, averaged over ranks by DDP or FSDP (whose reduce-scatter runs after
        # every micro-batch: its gradients stay sharded between them): x world / n is the global mean's
        grads = [p.grad for p in self.params if p.grad is not None]
        torch._foreach_mul_(grads, self.world / stats[TARGETS].clamp(min=1.0))
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return stats


def host_tensors(optimizer) -> list[torch.Tensor]:
    """Optimizer state that lives on the host by design (AdamW's step counters, unless capturable): reading
    it costs no device sync, so `count_syncs` may ignore it."""
    parts = getattr(optimizer, "parts", [optimizer])
    return [v for o in parts for param_state in o.state.values() for v in param_state.values()
            if torch.is_tensor(v) and v.device.type == "cpu" and v.ndim == 0]


class count_syncs(TorchDispatchMode):  # noqa: N801 (used as a context manager, like torch's own modes)
    """`with count_syncs(ignore=host_tensors(opt)) as c: ...` then `c.count` / `c.ops`: the operations run
    inside that would make the host wait for a CUDA device. Runs on any device (on CPU they cost nothing,
    which is why they must be counted rather than timed)."""

    def __init__(self, ignore: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.ignore = {id(t) for t in ignore}
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in SYNCING_OPS and not (args and torch.is_tensor(args[0]) and id(args[0]) in self.ignore):
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def count(self) -> int:
        return sum(self.ops.values())


__all__ = ["StepRunner", "StepStats", "wrap_ddp", "count_syncs", "host_tensors", "SYNCING_OPS"]
