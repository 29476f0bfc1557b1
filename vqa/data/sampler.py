"""Which images each rank trains on, and where a run is in its epoch.

One seeded permutation of the images per epoch is the *global* order. A step takes the next
world x batch x accum images of it; rank r's micro-batch j is the slice (j * world + r) * batch of the step's
images. So N devices x B images train on exactly the images of 1 device x N*B, and the position saved for
resume is a count of *images* of the global order: a run resumed with another world size, batch or
accumulation continues at the same image, neither skipping nor repeating any.

A resumed position need not be a multiple of the new world x batch x accum: the steps then start at it, and the
images left at the end of the epoch that do not fill a whole step are dropped (as an epoch's remainder always
is), so every rank gets the same number of whole micro-batches and steps, and after k steps the position is
start + k x world x batch x accum on every rank.
"""

from __future__ import annotations

import torch


def epoch_permutation(n: int, epoch: int, seed: int) -> list[int]:
    """The global image order of an epoch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def steps_in_epoch(n: int, images_per_step: int) -> int:
    """Whole steps in an epoch of n images (the remainder is dropped, a different one each epoch)."""
    return n // images_per_step


def steps_left(n: int, start: int, images_per_step: int) -> int:
    """Whole steps in the rest of an epoch of n images from image `start` of its global order (any start)."""
    return max(0, n - start) // images_per_step


def rank_order(n: int, epoch: int, seed: int, start: int, rank: int, world: int, batch: int, accum: int) -> list[int]:
    """Rank `rank`'s images, in order, for the rest of the epoch from image `start` of the global order:
    consecutive runs of `batch` are its micro-batches, `accum` of them a step. Every rank gets
    `steps_left(n, start, world * batch * accum)` whole steps, whatever `start` is."""
    if start < 0 or not 0 <= rank < world or min(batch, accum) < 1:
        raise ValueError(f"rank_order: bad position or layout (start {start}, rank {rank} of {world}, "
                         f"batch {batch}, accum {accum})")
    perm = epoch_permutation(n, epoch, seed)
    per_step = world * batch * accum
    out: list[int] = []
    for k in range(steps_left(n, start, per_step)):
        s0 = start + k * per_step
        for j in range(accum):
            lo = s0 + (j * world + rank) * batch
            out += perm[lo : lo + batch]
    return out


__all__ = ["epoch_permutation", "steps_in_epoch", "steps_left", "rank_order"]
