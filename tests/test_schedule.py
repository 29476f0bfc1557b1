"""The learning-rate schedules: Noam's formula as the Transformer paper writes it, `--schedule noam` as that
curve scaled to peak at --lr, and a `vqa train --schedule noam` run whose logged rates follow it."""

from __future__ import annotations

import json
import math

import pytest
from conftest import tiny_set_flags

from vqa.cli import main
from vqa.train.optim import lr_factor, noam


@pytest.mark.parametrize("step,warmup,d", [(1, 4000, 512), (4000, 4000, 512), (10_000, 4000, 512), (7, 3, 96)])
def test_noam_is_the_papers_formula(step, warmup, d):
    want = d ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    assert noam(step, warmup, d) == pytest.approx(want, rel=1e-12)


def test_noam_rises_linearly_to_its_peak_at_the_warmup_then_falls_as_one_over_sqrt_step():
    assert noam(400, 4000, 512) == pytest.approx(noam(4000, 4000, 512) / 10)
    assert noam(16_000, 4000, 512) == pytest.approx(noam(4000, 4000, 512) / 2)
    assert max(range(1, 20_000, 7), key=lambda s: noam(s, 4000, 512)) in range(3990, 4010)


@pytest.mark.parametrize("warmup", [1, 10, 100])
def test_the_noam_factor_is_the_formula_over_its_peak_for_any_width(warmup):
    for step in (0, warmup // 2, warmup - 1, warmup, 3 * warmup, 50 * warmup):
        for d in (96, 512):
            want = noam(step + 1, warmup, d) / noam(warmup, warmup, d)
            assert lr_factor(step, warmup, total=10, schedule="noam") == pytest.approx(want)
    assert lr_factor(warmup - 1, warmup, total=10, schedule="noam") == pytest.approx(1.0)


def test_cosine_stays_the_default_and_an_unknown_schedule_is_refused():
    assert lr_factor(0, 2, 10) == lr_factor(0, 2, 10, schedule="cosine") == 0.5
    assert lr_factor(9, 2, 10) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        lr_factor(0, 2, 10, schedule="linear")


@pytest.mark.slow
def test_train_with_schedule_noam_logs_noams_rates(shapes_dir, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--warmup", "2",
            "--log-every", "1", "--eval-images", "0", "--lr", "3e-3", "--optimizer", "adamw", "--max-steps", "6",
            "--schedule", "noam", *tiny_set_flags()]
    assert main(args) == 0
    logged = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if "lr" in r}
    assert sorted(logged) == [1, 2, 3, 4, 5, 6]
    for step, lr in logged.items():  # the rate of step `step` (counted from 1): 3e-3 x sqrt(2 / step) after the peak
        assert lr == pytest.approx(3e-3 * noam(step, 2, 96) / noam(2, 2, 96)), step
    assert json.loads((run / "train_config.json").read_text())["schedule"] == "noam"
