"""When training evaluates (`--eval-every 0`, the default): four times a run, at each quarter of its planned
steps, or of its --time-limit's time; never after every step of a short run, never at steps that wander as a
time-limited run's plan is refitted."""

import json
import time

from conftest import tiny_set_flags

from vqa import train
from vqa.cli import main
from vqa.train.budget import TimeBudget, evaluation_due


def eval_steps(run) -> list[int]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in recs if any(k.startswith("val_") for k in r)]


def args(data, run, *extra):
    return ["train", "--data", str(data), "--out", str(run), "--batch-size", "2", "--eval-images", "2",
            "--log-every", "1", *tiny_set_flags(), *extra]


def test_a_short_run_evaluates_at_its_quarters_not_after_every_step(shapes_dir, tmp_path):
    assert main(args(shapes_dir, tmp_path / "r", "--max-steps", "5")) == 0
    assert eval_steps(tmp_path / "r") == [2, 3, 4, 5]  # 5 x 1/4, 2/4, 3/4, 4/4 rounded up


def test_evaluations_follow_the_quarters_not_a_step_count_that_moves():
    # steps: four a run, whatever the length; --eval-every N: every N steps
    assert [s for s in range(1, 6) if evaluation_due(s, 0, 5)] == [2, 3, 4, 5]
    assert [s for s in range(1, 1945) if evaluation_due(s, 0, 1944)] == [486, 972, 1458, 1944]
    assert [s for s in range(1, 11) if evaluation_due(s, 3, 10)] == [3, 6, 9]
    # a time-limited run: the quarter of its time decides, whatever its planned steps say (the plan
    # that changed at every refit made evaluations come at arbitrary steps: 72, 84, 85 of a 10-minute run)
    # 72 % (144 // 4) == 0, no quarter passed
    assert evaluation_due(72, 0, 144, quarter=0, evaluated_quarter=0) is False
    assert evaluation_due(73, 0, 144, quarter=1, evaluated_quarter=0) is True
    assert evaluation_due(74, 0, 144, quarter=1, evaluated_quarter=1) is False


def test_a_time_limited_run_evaluates_once_a_quarter_of_its_time(shapes_dir, tmp_path, monkeypatch):
    """On the run's own clock, the k-th evaluation comes once k quarters have passed, one per quarter (a
    step that takes longer than a quarter passes two at once), and the last closes the run."""
    real_eval, real_budget = train.Trainer._evaluate_and_save, TimeBudget.__init__
    stamps, clock = [], []

    def evaluated(self, metrics):
        stamps.append(time.time())
        return real_eval(self, metrics)

    def budget(self, *a, **k):
        real_budget(self, *a, **k)
        clock.append(self)

    monkeypatch.setattr(train.Trainer, "_evaluate_and_save", evaluated)
    monkeypatch.setattr(TimeBudget, "__init__", budget)
    assert main(args(shapes_dir, tmp_path / "t", "--time-limit", "8s")) == 0
    assert len(eval_steps(tmp_path / "t")) == len(stamps) <= 4
    *mid, _ = [clock[0].quarter(t - clock[0].start) for t in stamps]
    assert mid == sorted(set(mid)) and all(q >= 1 for q in mid), mid
