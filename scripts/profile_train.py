"""Where a training step's time goes, on a real data folder: vqa train's own Trainer and step.

    .venv/bin/python scripts/profile_train.py --data data/shapes                   # the tiny preset
    .venv/bin/python scripts/profile_train.py --data data/shapes --preset tiny --steps 20 --top 25

After a few warm-up steps it times --steps steps split into their parts (medians, ms): data (the loader's next
batch), forward (the Objective: encoder, decoder, loss), backward, optimizer (step and zero_grad); then it
profiles 5 whole steps (vqa.train.step.StepRunner) with torch.profiler and prints the operators by self time.
A scratch run folder is written under the system's temporary folder and removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from vqa.config import TrainConfig
from vqa.train.trainer import Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a data folder (e.g. data/shapes)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=15, help="steps timed by part")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--top", type=int, default=20, help="operators listed")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = tempfile.mkdtemp(prefix="vqa-profile-train-")
    try:
        t = Trainer(TrainConfig(data=a.data, out=out, preset=a.preset, max_steps=10**6, eval_images=0))
        batches, run = t.batches(), t.runner
        for _ in range(5):
            run(next(batches))
        parts: dict[str, list[float]] = {"data": [], "forward": [], "backward": [], "optimizer": []}
        for _ in range(a.steps):
            t0 = time.perf_counter()
            b = next(batches)[0]
            t1 = time.perf_counter()
            groups = [g.to(t.d.device) for g in b.groups]
            loss = run.fwd(run.images(b, t.d.device), groups, [run.weights[g.task] for g in groups])
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            t.optimizer.step()
            t.optimizer.zero_grad(set_to_none=True)
            t4 = time.perf_counter()
            for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[k].append(v * 1000)
        total = sum(statistics.median(v) for v in parts.values())
        print(f"{a.preset}, {t.images_per_step} images a step, {torch.get_num_threads()} threads: "
              + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in parts.items())
              + f"; {total:.0f} ms a step, {t.images_per_step / total * 1000:.0f} images/s")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                run(next(batches))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top))
        t.close()
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
