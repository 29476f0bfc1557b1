"""When training evaluates (`--eval-every 0`, the default): four times a run, at each quarter of its planned
steps, or of its --time-limit's time; never after every step of a short run, never at steps that wander as a
time-limited run's plan is refitted."""

import json
import time

from conftest import tiny_set_flags

from vqa import train
from vqa.cli import main


def eval_steps(run) -> list[int]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in recs if any(k.startswith("val_") for k in r)]


def args(data, run, *extra):
    return ["train", "--data", str(data), "--out", str(run), "--batch-size", "2", "--eval-images", "2",
            "--log-every", "1", *tiny_set_flags(), *extra]


def test_a_short_run_evaluates_at_its_quarters_not_after_every_step(shapes_dir, tmp_path):
    assert main(args(shapes_dir, tmp_path / "r", "--max-steps", "5")) == 0
    assert eval_steps(tmp_path / "r") == [2, 3, 4, 5]  # 5 x 1/4, 2/4, 3/4, 4/4 rounded up


def test_a_time_limited_run_evaluates_at_each_quarter_of_its_time(shapes_dir, tmp_path, monkeypatch):
    """Steps that slow down after step 30 make the plan shrink at every refit; evaluations still come at
    the quarters of the 8 s and at the end, four in all."""
    real = train.Trainer.train_step
    stamps = []

    def slowing(self, micro, extra=()):
        out = real(self, micro, extra)
        time.sleep(0.005 if self.step < 30 else 0.05)
        return out

    def evaluated(self, metrics):
        stamps.append(time.time() - t0)
        return real_eval(self, metrics)

    real_eval = train.Trainer._evaluate_and_save
    monkeypatch.setattr(train.Trainer, "train_step", slowing)
    monkeypatch.setattr(train.Trainer, "_evaluate_and_save", evaluated)
    t0 = time.time()
    assert main(args(shapes_dir, tmp_path / "t", "--time-limit", "8s")) == 0
    steps = eval_steps(tmp_path / "t")
    assert len(steps) == 4 and steps == sorted(set(steps)), steps
    # the k-th evaluation once k quarters (2 s each) have passed (t0 is before the run's clock starts, so these
    # times are if anything longer than the run's own), and the first one well before the end
    assert all(stamps[k] >= 2 * (k + 1) for k in range(3)) and stamps[0] < stamps[-1] - 3, stamps
