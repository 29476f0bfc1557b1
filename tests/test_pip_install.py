"""The product as a `pip install` user has it: the wheel built from this checkout, installed into a fresh
virtual environment, run from a folder outside the checkout. The commands are the README's Install section's.

The new environment sees the test environment's torch and the other dependencies through a .pth file (no
downloads: this machine may be offline); vqa itself comes only from the wheel, which the test checks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import pytest

from vqa.weights import shipped

pytestmark = pytest.mark.slow
gradio_client = pytest.importorskip("gradio_client", reason="gradio_client is not installed (pip install '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The `vqa ...` lines of the README's block that follows "After an install"."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("After an install"):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.startswith("vqa")]


def command(line: str, **smaller: str | None) -> list[str]:
    """A README line as argv, with the values of some flags made smaller (`train="64"` for `--train 2000`;
    None drops the flag)."""
    argv = shlex.split(line)
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].lstrip("-").replace("-", "_")
        if argv[i].startswith("--") and flag in smaller:
            out += [] if smaller[flag] is None else [argv[i], smaller[flag]]
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh venv holding the wheel of this checkout."""
    work = tmp_path_factory.mktemp("pip")
    src = work / "src"  # what the wheel is built from, copied: a build writes build/ and *.egg-info beside it
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "vqa", src / "vqa", ignore=shutil.ignore_patterns("__pycache__"))
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(work / "dist")], check=True, cwd=work, env=clean, timeout=300)
    wheel = next((work / "dist").glob("vqa-*.whl"))
    env_dir = work / "env"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-build-isolation", str(wheel)], check=True, env=clean, timeout=300)
    # then the test environment's packages (torch, gradio, ...) behind the venv's own; their folder's .pth files
    # are not run, so an editable vqa there stays out of reach
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir / "bin"


def run(bin_dir: Path, cwd: Path, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", OMP_NUM_THREADS="1", GRADIO_ANALYTICS_ENABLED="False")
    out = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, (argv, out.stderr[-3000:])
    return out


def test_the_wheel_works_from_any_folder(installed, tmp_path):
    lines = {" ".join(line.split()[:3]): line for line in readme_commands()}
    where = run(installed, tmp_path, ["python", "-c", "import vqa; print(vqa.__file__)"]).stdout.strip()
    assert where.startswith(str(installed.parent)), where  # the wheel's copy, not the checkout's
    # the demo's packages and huggingface_hub are the wheel's own requirements, not an extra's
    code = "import importlib.metadata as m; print('\\n'.join(m.requires('vqa')))"
    requires = run(installed, tmp_path, ["python", "-c", code]).stdout.splitlines()
    core = {re.split(r"[<>=;\[ ]", r)[0].replace("-", "_").lower() for r in requires if "extra ==" not in r}
    assert {"gradio", "matplotlib", "huggingface_hub"} <= core, core
    assert re.fullmatch(r"vqa \d+\.\d+\.\d+\n", run(installed, tmp_path, ["vqa", "--version"]).stdout)
    run(installed, tmp_path, command(lines["vqa data shapes"], train="48", val="8") + ["--workers", "1"])
    train = command(lines["vqa train --data"], time_limit=None)
    run(installed, tmp_path, train + ["--max-steps", "2", "--eval-images", "4", "--workers", "0"])
    # the wheel carries the tiny preset's pretrained towers, and the README's run started from them
    card = json.loads((tmp_path / train[train.index("--out") + 1] / "last" / "card.json").read_text())
    assert card["init_from"]["sha256"] == shipped.sha256(shipped.folder("tiny") / "model.safetensors")
    code = "from vqa.weights import shipped; print(shipped.sha256(shipped.folder('tiny') / 'model.safetensors'))"
    assert run(installed, tmp_path, ["python", "-c", code]).stdout.strip() == card["init_from"]["sha256"]
    run(installed, tmp_path, command(lines["vqa data samples"]))
    ask = run(installed, tmp_path, command(lines["vqa ask --checkpoint"]))
    assert ask.stdout.strip(), ask
    # the demo, started as the README says (--port added), answers one question through gradio_client
    port = _free_port()
    demo = command(lines["vqa demo --checkpoint"]) + ["--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen([str(installed / "vqa"), *demo[1:]], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line, t0 = "", time.time()
        while "serving" not in line and time.time() - t0 < 180 and proc.poll() is None:
            line = proc.stdout.readline()
        assert f"at http://127.0.0.1:{port}/" in line, line
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        picture = gradio_client.handle_file(str(tmp_path / "samples" / "shapes_1.png"))
        answer = client.predict(picture, "what color is the large triangle?", 1, api_name="/ask")[0]
        assert isinstance(answer, str) and answer.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
