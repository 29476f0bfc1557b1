"""The folder-split sampler (`vqa.data.sampler.rank_order`): from any saved position, including one that is not
a multiple of the new world x batch x accum (an elastic resume), every rank steps the same number of times on
whole micro-batches, and the steps are the global order's next images, none skipped or repeated."""

from __future__ import annotations

import pytest

from vqa.data.sampler import epoch_permutation, rank_order, steps_left

CASES = [  # (n, world, batch, accum, start)
    (50, 2, 4, 1, 6),  # 44 images left: 5 steps of 8, 4 dropped (rank 0 used to get a 6th micro-batch alone)
    (50, 2, 2, 2, 24),  # 26 left: 3 steps of 8, 2 dropped
    (50, 3, 2, 1, 7),
    (50, 4, 3, 2, 1),
    (37, 3, 4, 1, 5),  # 32 left: 2 steps of 12 (ranks 0 and 1 used to get a third micro-batch, rank 2 none)
    (37, 2, 5, 3, 0),
    (64, 4, 4, 1, 16),  # a multiple: nothing dropped before the epoch's own remainder
    (64, 4, 4, 1, 63),  # less than a step left: no step at all (rank 0 used to get a 1-image micro-batch)
    (64, 2, 4, 1, 64),  # the epoch done
    (64, 2, 4, 1, 70),  # past it
    (10, 1, 3, 1, 4),
]


@pytest.mark.parametrize("n,world,batch,accum,start", CASES)
def test_every_rank_steps_the_same_number_of_times_from_any_position(n, world, batch, accum, start):
    epoch, seed = 2, 5
    per_step = world * batch * accum
    perm = epoch_permutation(n, epoch, seed)
    ranks = [rank_order(n, epoch, seed, start, r, world, batch, accum) for r in range(world)]
    steps = max(0, n - start) // per_step
    assert steps_left(n, start, per_step) == steps
    for order in ranks:  # the same number of whole micro-batches, a whole number of steps, on every rank
        assert len(order) == steps * accum * batch
    for k in range(steps):  # step k is the global order's next per_step images: the position after it is exact
        micro = [order[k * accum * batch : (k + 1) * accum * batch] for order in ranks]
        assert sorted(i for m in micro for i in m) == sorted(perm[start + k * per_step : start + (k + 1) * per_step])
        for r in range(world):  # rank r's micro-batch j: slice (j * world + r) * batch of the step's images
            for j in range(accum):
                lo = start + k * per_step + (j * world + r) * batch
                assert micro[r][j * batch : (j + 1) * batch] == perm[lo : lo + batch]
    seen = [i for order in ranks for i in order]
    assert len(seen) == len(set(seen)) and not set(seen) & set(perm[:start])  # nothing repeated or re-trained


def test_a_resumed_epoch_continues_where_an_uninterrupted_one_would():
    """1 rank x 2 images for 3 steps, then 2 ranks x 4 images: the resumed steps are those of the
    uninterrupted 8-image run shifted by the 6 images done."""
    n, epoch, seed = 50, 0, 1
    perm = epoch_permutation(n, epoch, seed)
    done = rank_order(n, epoch, seed, 0, 0, 1, 2, 1)[:6]
    rest = [rank_order(n, epoch, seed, 6, r, 2, 4, 1) for r in range(2)]
    assert done == perm[:6] and [len(r) for r in rest] == [20, 20]
    assert sorted(done + rest[0] + rest[1]) == sorted(perm[:46])  # 4 left over: fewer than a step of 8


def test_bad_positions_are_refused():
    with pytest.raises(ValueError, match="start -1"):
        rank_order(10, 0, 0, -1, 0, 1, 2, 1)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        rank_order(10, 0, 0, 0, 2, 2, 2, 1)
