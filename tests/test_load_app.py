"""scripts/load_app.py at a small count, as CI runs it: it starts the app in its own process, asks alone and
then with several users at once, then opens a few explorer users, and every question is answered
(defaults) or, with a deliberately tiny queue, answered or refused with a message meant for a person: never an
error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from predict_fixtures import ROOT, shared_checkpoint

pytest.importorskip("gradio_client", reason="gradio_client is not installed (pip install -e '.[dev]')")
pytestmark = pytest.mark.slow


def _run(tmp_path, *args):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "load_app.py"), "--checkpoint",
                           str(shared_checkpoint()), "--alone", "2", "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    return proc, (json.loads(out.read_text()) if out.is_file() else None)


def test_the_load_script_runs_and_nothing_fails(tmp_path):
    proc, fig = _run(tmp_path, "--users", "4", "--questions", "2", "--explorer-users", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fig["requests"] == fig["answered"] == 8 and fig["refused"] == fig["errors"] == 0
    assert fig["explorer_users"] == 3 and fig["explorer_failed"] == 0 and fig["rss_after_users_mib"] > 0
    assert "3 explorer users opened and closed, 0 failed: server RSS" in proc.stdout
    assert 0 < fig["median_s"] and fig["alone_median_s"] > 0 and fig["wall_s"] > 0
    assert "4 users x 2 questions at once: 8 answered, 0 refused, 0 errors" in proc.stdout


def test_an_overfull_queue_refuses_politely(tmp_path):
    # one request worked on and one waiting: users beyond that are turned away, each with a message
    proc, fig = _run(tmp_path, "--users", "6", "--questions", "2", "--", "--max-batch", "1", "--concurrency", "1",
                     "--queue-size", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fig["errors"] == 0 and fig["answered"] + fig["refused"] == 12 and fig["answered"] > 0
    # six users at once and room for two: some are refused (an unbounded queue would answer all 12) ...
    assert fig["refused"] > 0 and fig["refusal_examples"], fig
    # ... each with a message meant for a person
    assert all("Queue is full" in r or "busy" in r for r in fig["refusal_examples"])
