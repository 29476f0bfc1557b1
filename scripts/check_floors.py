"""Install the package at the floors of its core dependencies (constraints-floor.txt) in a fresh virtual
environment and run the core tests there: the ranges in pyproject.toml are the ones that pass. It downloads
from PyPI, so neither `make test` nor .ci/run calls it.

    python scripts/check_floors.py [--keep] [pytest arguments...]

torch and torchvision are not downloaded (gigabytes): the copies of the interpreter that runs this script,
which must be at the versions the file names, are linked into the new environment with the packages they need.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ROOT / "constraints-floor.txt"
# model build, a short training run, checkpoints, predict/ask, the tokenizer and the data readers; none
# needs an extra (the tests of an extra's path skip on importorskip)
TESTS = ["tests/test_model.py", "tests/test_vision.py", "tests/test_train_trip.py",
         "tests/test_checkpoint_format.py", "tests/test_checkpoint_io.py", "tests/test_checkpoint_errors.py",
         "tests/test_predict.py", "tests/test_ask_checks.py", "tests/test_special_tokens.py",
         "tests/test_data_formats.py", "tests/test_data_dataset.py", "tests/test_shipped_weights.py"]
LINKED = ("torch", "torchvision")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """constraints-floor.txt as {normalized name: version}."""
    out = {}
    for line in FLOORS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[_norm(name)] = version.strip()
    return out


def closure(roots: tuple[str, ...], skip: set[str]) -> list[md.Distribution]:
    """The installed distributions that `roots` need, transitively, less those in `skip` (pip installs those
    at their floors)."""
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [(name, "") for name in roots]
    while todo:
        name, extra = todo.pop()
        name = _norm(name)
        if name in skip or (name, extra) in done:
            continue
        done.add((name, extra))
        dist = seen.setdefault(name, md.distribution(name))
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                # an extra (cuda-toolkit[cublas]) brings the requirements marked with it
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return list(seen.values())


def link_torch(overlay: Path, floors: dict[str, str]) -> None:
    """Symlink torch, torchvision and the packages they need from this interpreter into `overlay`."""
    for name in LINKED:
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            sys.exit(f"check_floors: run it with an interpreter that has {name} {floors[name]} installed")
        if have != floors[name]:
            sys.exit(f"check_floors: this interpreter has {name} {have}, constraints-floor.txt wants {floors[name]}")
    overlay.mkdir()
    for dist in closure(LINKED, skip=set(floors) - set(LINKED)):
        site = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src, dst = site / top, overlay / top
            if src.exists() and not dst.exists() and top != "__pycache__":
                dst.symlink_to(src)


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    args, pytest_args = p.parse_known_args()
    start = time.monotonic()
    floors = pins()
    tmp = Path(tempfile.mkdtemp(prefix="vqa-floors-"))
    print(f"check_floors: {tmp}", flush=True)
    try:
        venv = tmp / "venv"
        run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)])
        py = venv / "bin" / "python"
        link_torch(tmp / "overlay", floors)
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        # a .pth line puts the linked torch on the new interpreter's path, where pip counts it as installed
        (Path(purelib) / "vqa_floor_torch.pth").write_text(f"{tmp / 'overlay'}\n")
        run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(FLOORS),
             str(ROOT), "pytest", "pytest-timeout"])
        run([str(py), "-m", "pip", "list", "--disable-pip-version-check"])
        # run the tests from a copy so that `import vqa` finds the installed package, not the checkout's
        shutil.copytree(ROOT / "tests", tmp / "tests")
        shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
        code = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *pytest_args],
                              cwd=tmp).returncode
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"check_floors: pytest exited {code} after {time.monotonic() - start:.0f} s", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
