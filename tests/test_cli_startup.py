"""The command line answers before the heavy modules load: `--help`, `--version` and usage errors (bad or missing
options, a data folder that is not there) never import torch or gradio, and the exit status says which kind
of error it was (2 usage, 1 a failure while running). Speed itself is in docs/results/performance.md, measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import contextlib, io, json, sys
from vqa.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
heavy = sorted(m for m in ("torch", "gradio", "timm", "matplotlib") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy, "err": err.getvalue()}))
"""


def probe(*argv: str, cwd: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv, code, says", [
    (["--version"], 0, ""),
    (["train", "--help"], 0, ""),
    (["demo", "--help"], 0, ""),
    (["export", "--help"], 0, ""),
    (["import", "--help"], 0, ""),
    (["train", "--data", "D"], 2, "--out is required"),
    (["train", "--data", "no-such-folder", "--out", "run"], 1, "no-such-folder: no such data folder"),
    (["train", "--data", "D", "--out", "run", "--max-steps", "-3"], 2, "--max-steps must be"),
    (["train", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["demo", "--port", "99999"], 2, "--port must be from 1 to 65535"),
    (["export", "--checkpoint", "run"], 2, "one of the arguments --onnx --transformers is required"),
])
def test_help_and_usage_errors_never_load_torch(argv, code, says, tmp_path):
    out = probe(*argv, cwd=tmp_path)
    assert out["code"] == code and says in out["err"], out
    assert out["heavy"] == [], out
    assert "Traceback" not in out["err"]


def test_the_demo_reads_gradios_address_variables(tmp_path, monkeypatch):
    import argparse

    from vqa.demo.options import add_arguments, check

    p = argparse.ArgumentParser()
    add_arguments(p)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7999")
    args = p.parse_args([])
    assert check(args) is None and (args.host, args.port) == ("0.0.0.0", 7999)
    args = p.parse_args(["--host", "127.0.0.1", "--port", "8001"])  # the flags win
    assert check(args) is None and (args.host, args.port) == ("127.0.0.1", 8001)
    monkeypatch.delenv("GRADIO_SERVER_NAME")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "http")
    args = p.parse_args([])
    assert check(args) == "GRADIO_SERVER_PORT must be a port number, got 'http'" and args.host == "127.0.0.1"


def test_ask_help_gives_the_answers_default_decoding():
    from vqa.cli import build_parser

    text = " ".join(build_parser(["ask"]).commands["ask"].format_help().split())
    method = text[text.rindex("--method {greedy,beam,sample}"):][:200]  # the option, not the usage line
    assert "default: beam for answers" in method and "(default: greedy)" not in method, method


def test_openmp_threads_wait_without_spinning_unless_the_user_says_otherwise():
    code = "import os, vqa, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(ROOT)

    def policy(e: dict) -> str:
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                              timeout=120).stdout.strip()

    assert policy(env) == "PASSIVE"
    assert policy({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
