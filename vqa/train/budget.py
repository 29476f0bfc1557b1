"""`--time-limit`: the cosine schedule fitted to a wall-clock budget.

The plan is first made from the median of the first 20 steps (aiming at 90% of the time left, as evaluations
and checkpoints also take time), then remade from the mean speed since the last plan every 50 steps or 5%
of the budget, whichever comes first (aiming at 98%): a run slows down after its first steps (data caches fill,
evaluations), so a plan fitted once would end the run before its cosine does.

Every rank must follow one schedule and stop at one step: `SharedBudget` has each rank propose its decisions
(`Proposal`: out of time, a refitted plan, the quarter reached) as values that ride in the step's all-reduce,
and reads back what the ranks agreed (`TimeDecision`): any rank out of time stops them all, the plans are
averaged, and so are the quarters. One rank decides alone at every step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import NamedTuple


class FitMark(NamedTuple):
    """Where the step time was last fitted: the clock and the step then."""

    time: float
    step: int


class TimeBudget:
    FIRST_FIT, REFIT_EVERY = 20, 50

    def __init__(self, limit_s: float, time_used: float = 0.0):
        self.limit = float(limit_s)
        self.start = time.time() - float(time_used)  # a resumed run continues on its remaining time
        self.steps_timed = 0
        self.durations: list[float] = []
        self.fit_from: FitMark | None = None

    def elapsed(self) -> float:
        return time.time() - self.start

    def out_of_time(self) -> bool:
        return self.elapsed() >= self.limit

    def quarter(self, elapsed: float | None = None) -> int:
        """How many quarters of the budget have passed (0-3; the end is the run's own last evaluation)."""
        return min(3, int(4 * (self.elapsed() if elapsed is None else elapsed) / self.limit))

    def record(self, seconds: float) -> None:
        """The duration of one training step."""
        self.durations.append(seconds)

    def due(self, step: int) -> bool:
        """After the first 20 steps, then every 50 steps or every 5% of the budget, whichever comes first (a
        short budget, or steps that slow down a lot, would overshoot between step-counted refits)."""
        if len(self.durations) < self.FIRST_FIT:
            return False
        if self.fit_from is None:
            return True
        return step - self.fit_from.step >= self.REFIT_EVERY or time.time() - self.fit_from.time >= self.limit / 20

    def plan(self, step: int) -> int:
        """The total step count that ends the schedule when the budget runs out, seen from `step`."""
        now = time.time()
        if self.fit_from is None:
            timed = sorted(self.durations[1:])  # the first step compiles / warms caches
            per_step, share = timed[len(timed) // 2], 0.9
        else:
            per_step, share = (now - self.fit_from.time) / max(1, step - self.fit_from.step), 0.98
        self.fit_from = FitMark(now, step)
        return step + max(1, int(share * (self.limit - (now - self.start)) / max(per_step, 1e-9)))


@dataclass(frozen=True)
class TimeDecision:
    """What every rank does after a step."""

    out_of_time: bool = False  # stop now (and save)
    plan: int | None = None  # the refitted total step count; None: the plan stands
    quarter: int = 0  # quarters of the budget passed (0-3)


@dataclass(frozen=True)
class Proposal:
    """One rank's decisions as values that add up over ranks (the step's all-reduce sums them)."""

    out_of_time: float = 0.0  # 1: this rank's time is up
    plan_sum: float = 0.0  # its refitted total step count, or 0
    plans: float = 0.0  # 1: it refitted
    quarter_sum: float = 0.0  # the quarter it reached

    SIZE = 4  # values in the all-reduce

    def values(self) -> tuple[float, ...]:
        return astuple(self)

    @classmethod
    def summed(cls, values: Sequence[float]) -> Proposal:
        """The proposals of every rank, summed by the all-reduce."""
        if len(values) != cls.SIZE:
            raise ValueError(f"a proposal is {cls.SIZE} values, not {len(values)}")
        return cls(*map(float, values))

    def decision(self, world: int) -> TimeDecision:
        """The ranks' agreement: any rank out of time, the mean plan of those that refitted, the mean quarter."""
        return TimeDecision(out_of_time=self.out_of_time > 0,
                            plan=int(self.plan_sum / self.plans) if self.plans else None,
                            quarter=int(self.quarter_sum) // world)


class SharedBudget:
    """A `TimeBudget` that `world` ranks follow together. Each step: `propose` (the values for the step's
    all-reduce), the step, `record` its duration, then `agree` on what the all-reduce summed. With several
    ranks, proposals count at logged steps only (where the caller reads the all-reduce): elsewhere they are
    zeros and nothing changes; one rank decides at every step, on its clock after the step."""

    def __init__(self, limit_s: float, time_used: float = 0.0, world: int = 1):
        self.budget = TimeBudget(limit_s, time_used)
        self.world = int(world)
        self.quarter = self.budget.quarter(time_used)  # the last quarter agreed (a resumed run: its own)
        self._proposed = Proposal()

    def propose(self, step: int, logged: bool) -> tuple[float, ...]:
        """This rank's proposal before `step`, as Proposal.SIZE values for the step's all-reduce."""
        b = self.budget
        if self.world > 1 and not logged:
            self._proposed = Proposal()
        else:
            plan = b.plan(step) if b.due(step) else None
            self._proposed = Proposal(out_of_time=float(b.out_of_time()), plan_sum=float(plan or 0),
                                      plans=float(plan is not None), quarter_sum=float(b.quarter()))
        return self._proposed.values()

    def record(self, seconds: float) -> None:
        """The duration of one training step."""
        self.budget.record(seconds)

    def agree(self, summed: Sequence[float] | None) -> TimeDecision:
        """What every rank does after the step: `summed`, the proposals summed over ranks (None: the step's
        all-reduce was not read, so nothing is decided)."""
        if self.world == 1:  # alone: its own proposal, and its clock read again after the step
            p = self._proposed
            decision = TimeDecision(out_of_time=p.out_of_time > 0 or self.budget.out_of_time(),
                                    plan=int(p.plan_sum) if p.plans else None, quarter=self.budget.quarter())
        elif summed is not None:
            decision = Proposal.summed(summed).decision(self.world)
        else:
            decision = TimeDecision(quarter=self.quarter)
        self.quarter = decision.quarter
        return decision


def evaluation_due(step: int, every: int, total: int | None, quarter: int | None = None,
                   evaluated_quarter: int = 0) -> bool:
    """Whether training evaluates after `step`: every `every` steps if given; else four times a run, at each
    quarter of a --time-limit's time (`quarter`: the quarter reached, evaluated once it passes
    `evaluated_quarter`, the last one evaluated; the planned step count moves as the plan is refitted) or of
    the `total` planned steps (5 steps: after 2, 3, 4, 5). The run's last step evaluates in any case (the
    caller)."""
    if every:
        return step % every == 0
    if quarter is not None:
        return quarter > evaluated_quarter
    total = total or 10**9
    return step * 4 // total > (step - 1) * 4 // total


__all__ = ["TimeBudget", "SharedBudget", "Proposal", "TimeDecision", "evaluation_due"]
