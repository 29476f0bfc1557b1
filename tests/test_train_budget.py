"""The time limit shared by the ranks (`vqa.train.budget.SharedBudget`), in one process: each rank's proposal
is summed as the step's all-reduce sums it, and every rank reads back one decision: any rank out of time stops
them all, the plans and quarters are averaged; one rank decides alone at every step."""

from __future__ import annotations

import pytest

from vqa.train.budget import Proposal, SharedBudget, TimeBudget, TimeDecision


def all_reduce(*proposals: tuple[float, ...]) -> list[float]:
    """What torch.distributed.all_reduce (a sum) makes of the ranks' values."""
    return [sum(v) for v in zip(*proposals, strict=True)]


def test_proposals_summed_over_ranks_agree_on_any_stop_the_mean_plan_and_the_mean_quarter():
    ranks = [Proposal(out_of_time=0.0, plan_sum=100.0, plans=1.0, quarter_sum=2.0),
             Proposal(out_of_time=1.0, plan_sum=0.0, plans=0.0, quarter_sum=3.0),
             Proposal(out_of_time=0.0, plan_sum=110.0, plans=1.0, quarter_sum=2.0)]
    decision = Proposal.summed(all_reduce(*(p.values() for p in ranks))).decision(world=3)
    assert decision == TimeDecision(out_of_time=True, plan=105, quarter=2)
    assert Proposal.summed([0.0] * Proposal.SIZE).decision(world=3) == TimeDecision(False, None, 0)
    with pytest.raises(ValueError, match="4 values"):
        Proposal.summed([1.0, 2.0])


def test_one_ranks_time_running_out_stops_every_rank_at_the_same_logged_step():
    late = SharedBudget(60.0, time_used=61.0, world=2)  # this rank's clock is past the limit
    early = SharedBudget(60.0, time_used=0.0, world=2)
    # an unlogged step: nobody reads the all-reduce, so the proposals are zeros and nothing is decided
    assert late.propose(5, logged=False) == (0.0,) * Proposal.SIZE
    assert [b.agree(None) for b in (late, early)] == [TimeDecision(quarter=3), TimeDecision(quarter=0)]
    # a logged step: both ranks read the same sum and stop together
    summed = all_reduce(late.propose(6, logged=True), early.propose(6, logged=True))
    decisions = [late.agree(summed), early.agree(summed)]
    assert decisions[0] == decisions[1] and decisions[0].out_of_time
    assert decisions[0].quarter == (3 + 0) // 2 and early.quarter == 1


def test_a_refitted_plan_is_agreed_by_every_rank():
    ranks = [SharedBudget(600.0, world=2) for _ in range(2)]
    for b in ranks:
        for _ in range(TimeBudget.FIRST_FIT):
            b.record(0.5)
    summed = all_reduce(*(b.propose(20, logged=True) for b in ranks))
    plans = [b.agree(summed).plan for b in ranks]
    # 90% of the ~600 s left at 0.5 s a step, seen from step 20
    assert plans[0] == plans[1] and plans[0] == pytest.approx(20 + 0.9 * 600 / 0.5, abs=5)


def test_alone_a_rank_decides_every_step_on_its_clock_after_the_step():
    b = SharedBudget(60.0, world=1)
    b.propose(3, logged=False)
    assert b.agree(None) == TimeDecision(out_of_time=False, plan=None, quarter=0)
    b.propose(4, logged=False)
    b.budget.start -= 45.0  # the step took 45 s: three quarters have passed
    assert b.agree(None) == TimeDecision(out_of_time=False, plan=None, quarter=3)
    b.propose(5, logged=False)
    b.budget.start -= 30.0  # out of time during this step
    assert b.agree(None).out_of_time
