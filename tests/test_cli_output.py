"""What a `vqa train` writes to a log file (stderr not a terminal): its status lines, no progress-bar frames;
`--quiet` keeps warnings and errors only."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_set_flags

from vqa.cli import main
from vqa.logs import get_logger, set_quiet

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def train_args(shapes_dir, out, *extra) -> list[str]:
    return ["train", "--data", str(shapes_dir), "--out", str(out), "--batch-size", "4", "--max-steps", "3",
            "--log-every", "1", "--eval-images", "4", "--workers", "0", *tiny_set_flags(), *extra]


@pytest.fixture(autouse=True)
def loud_again():
    yield
    set_quiet(False)


def test_a_log_file_gets_status_lines_and_no_bar_frames(shapes_dir, tmp_path):
    log = tmp_path / "train.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, "-m", "vqa.cli", *train_args(shapes_dir, tmp_path / "run")],
                              stdout=f, stderr=subprocess.STDOUT, env=env, timeout=300).returncode
    text = log.read_text()
    assert code == 0, text[-2000:]
    assert "\r" not in text and "step/s" not in text, text[-2000:]  # tqdm's frames
    assert "vqa train: " in text and " M parameters, " in text and "vqa train: 3 steps in " in text, text


def test_quiet_keeps_warnings_only(shapes_dir, tmp_path, caplog, monkeypatch):
    get_logger("test")  # vqa's handler in place: it would turn propagation off again
    monkeypatch.setattr(logging.getLogger("vqa"), "propagate", True)  # caplog listens at the root logger
    caplog.set_level(logging.DEBUG)
    assert main(train_args(shapes_dir, tmp_path / "run", "--quiet")) == 0
    said = [r.getMessage() for r in caplog.records if r.name.startswith("vqa") and r.levelno < logging.WARNING]
    assert said == [] and (tmp_path / "run" / "last").is_dir()
    set_quiet(False)
    assert main(train_args(shapes_dir, tmp_path / "run2")) == 0
    assert any("M parameters" in r.getMessage() for r in caplog.records if r.name == "vqa.train")


def test_a_program_with_its_own_logging_sees_each_line_once(capsys, monkeypatch):
    """vqa's lines go to stderr once, not again through the root logger's handlers; use_root_logging() sends
    them to the root logger's handlers instead of stderr."""
    from vqa import logs

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep, vqa_root = Keep(), logging.getLogger("vqa")
    monkeypatch.setattr(vqa_root, "handlers", list(vqa_root.handlers))
    monkeypatch.setattr(vqa_root, "propagate", vqa_root.propagate)
    logging.getLogger().addHandler(keep)
    try:
        logs.get_logger("test").info("vqa test: one")
        assert capsys.readouterr().err.count("vqa test: one") == 1 and seen == []
        logs.use_root_logging()
        logs.get_logger("test").warning("vqa test: two")
        assert "vqa test: two" not in capsys.readouterr().err and seen == ["vqa test: two"]
    finally:
        logging.getLogger().removeHandler(keep)
