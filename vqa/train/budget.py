"""`--time-limit`: the cosine schedule fitted to a wall-clock budget.

The plan is first made from the median of the first 20 steps (aiming at 90% of the time left, as evaluations
and checkpoints also take time), then remade from the mean speed since the last plan every 50 steps or 5%
of the budget, whichever comes first (aiming at 98%): a run slows down after its first steps (data caches fill, evaluations), and fitted once a
ten-minute run ended at 80% of its cosine. Every rank must follow one schedule, so the plans of the ranks
are averaged by the caller.
"""

from __future__ import annotations

import time


class TimeBudget:
    FIRST_FIT, REFIT_EVERY = 20, 50

    def __init__(self, limit_s: float, time_used: float = 0.0):
        self.limit = float(limit_s)
        self.start = time.time() - float(time_used)  # a resumed run continues on its remaining time
        self.steps_timed = 0
        self.durations: list[float] = []
        self.fit_from: tuple[float, int] | None = None

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
        return step - self.fit_from[1] >= self.REFIT_EVERY or time.time() - self.fit_from[0] >= self.limit / 20

    def plan(self, step: int) -> int:
        """The total step count that ends the schedule when the budget runs out, seen from `step`."""
        now = time.time()
        if self.fit_from is None:
            timed = sorted(self.durations[1:])  # the first step compiles / warms caches
            per_step, share = timed[len(timed) // 2], 0.9
        else:
            per_step, share = (now - self.fit_from[0]) / max(1, step - self.fit_from[1]), 0.98
        self.fit_from = (now, step)
        return step + max(1, int(share * (self.limit - (now - self.start)) / max(per_step, 1e-9)))


def evaluation_due(step: int, every: int, total: int | None, quarters: tuple[int, int] | None = None) -> bool:
    """Whether training evaluates after `step`: every `every` steps if given; else four times a run, at each
    quarter of a --time-limit's time (`quarters`: (the quarter reached, the last one evaluated); its planned
    step count moves as the plan is refitted) or of the `total` planned steps (5 steps: after 2, 3, 4, 5).
    The run's last step evaluates in any case (the caller)."""
    if every:
        return step % every == 0
    if quarters is not None:
        return quarters[0] > quarters[1]
    total = total or 10**9
    return step * 4 // total > (step - 1) * 4 // total


__all__ = ["TimeBudget", "evaluation_due"]
