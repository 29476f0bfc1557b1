"""scripts/profile_train.py profiles training's own step: the rows as training lays them out (packed across
images), so its forward computes the real loss and its backward the real gradients."""

import math
import re
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_train.py"


def test_profile_train_times_the_real_loss_of_trainings_rows(shapes_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--data", str(shapes_dir), "--steps", "1", "--top", "3",
                                      "--batch-size", "4", "--threads", "1"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if "images a step" in s)
    loss = float(re.search(r"loss per target ([\d.]+)", line).group(1))
    # an untrained model's cross-entropy per target is near log(vocabulary): far from 0 (no rows) and finite
    assert 1.0 < loss < 2 * math.log(8192) and "aten::" in out, line
