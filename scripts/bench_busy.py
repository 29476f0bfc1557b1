"""Training speed on a busy machine: `vqa train --preset tiny` images/s alone and beside a one-thread job
started under `setsid` (as a second terminal is: Linux gives each such process group its own scheduling
group), for several thread settings of the measured run.

    python scripts/bench_busy.py --data data/shapes                      # all variants, 30 steps each
    python scripts/bench_busy.py --data data/shapes --steps 20 --variants default,passive --json busy.json

Variants: default (torch's threads, OpenMP's default waiting, which spins), passive (OMP_WAIT_POLICY=PASSIVE: threads
that wait sleep instead of spinning), one (OMP_NUM_THREADS=1). The neighbour is `vqa train` with OMP_NUM_THREADS=1
on the same data, under its own setsid, killed when the measurement ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "default": {"OMP_WAIT_POLICY": ""},  # set but empty: vqa keeps it, OpenMP calls it invalid and waits its own way
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "one": {"OMP_NUM_THREADS": "1"},
}
BATCH = 32  # tiny's CPU batch


def vqa() -> list[str]:
    exe = shutil.which("vqa")
    return [exe] if exe else [sys.executable, "-m", "vqa.cli"]


def train(data: str, out: Path, steps: int, env: dict, timeout: float) -> float | None:
    """Median images/s of `steps` training steps after the first (start-up excluded); None when it stalls."""
    cmd = [*vqa(), "train", "--data", data, "--out", str(out), "--preset", "tiny", "--max-steps", str(steps + 1),
           "--log-every", "1", "--eval-images", "0", "--batch-size", str(BATCH)]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    try:
        subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    speeds = [json.loads(line)["images_per_s"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"images_per_s"' in line][1:]  # each logged step's own images/s; the first holds the start-up
    if speeds:
        return statistics.median(speeds)
    return (steps + 1) * BATCH / (time.time() - t0)


def neighbour(data: str, out: Path) -> subprocess.Popen:
    """A one-thread `vqa train` under its own setsid, running until killed."""
    cmd = [*vqa(), "train", "--data", data, "--out", str(out), "--preset", "tiny", "--max-steps", "1000000",
           "--eval-images", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a Shapes data folder (vqa data shapes --out DIR)")
    p.add_argument("--steps", type=int, default=30, help="steps measured per run (default 30)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--timeout", type=float, default=300, help="seconds a run may take before it counts as stalled")
    p.add_argument("--json", default=None, help="also write the table as JSON here")
    args = p.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants: {', '.join(sorted(unknown))}")
    work = Path(tempfile.mkdtemp(prefix="bench-busy-"))
    rows = []
    try:
        for name in names:
            alone = train(args.data, work / "run", args.steps, VARIANTS[name], args.timeout)
            other = neighbour(args.data, work / "neighbour")
            try:
                time.sleep(10)  # the neighbour past its start-up, training
                beside = train(args.data, work / "run", args.steps, VARIANTS[name], args.timeout)
            finally:
                os.killpg(other.pid, signal.SIGTERM)
                other.wait()
            rows.append(dict(variant=name, alone=alone, beside=beside))
            print(f"{name:8s} alone {_fmt(alone)} images/s, beside a one-thread job under setsid "
                  f"{_fmt(beside)} images/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(steps=args.steps, batch=BATCH, load=os.getloadavg(), rows=rows),
                                              indent=2))


def _fmt(v: float | None) -> str:
    return "stalled" if v is None else f"{v:7.1f}"


if __name__ == "__main__":
    main()
