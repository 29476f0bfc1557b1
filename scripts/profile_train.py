"""Where a training step's time goes, on a real data folder: vqa train's own Trainer and step.

    .venv/bin/python scripts/profile_train.py --data data/shapes                   # the tiny preset
    .venv/bin/python scripts/profile_train.py --data data/shapes --preset tiny --steps 20 --top 25

    .venv/bin/python scripts/profile_train.py --data /tmp/s --preset base --device cuda   # kernels on a GPU

After a few warm-up steps it times --steps steps split into their parts (medians, ms): data (the loader's next
batch), forward (`VQAModel.forward`: the loss of the batch's rows packed across images as training lays them
out: encoder, decoder, loss), backward, optimizer (step and zero_grad); on CUDA each part ends with a
synchronize, so a part's time is its device time. Then it profiles 5 whole steps (vqa.train.step.StepRunner)
with torch.profiler and prints the operators by self time: CPU time on a CPU, kernel time on a GPU (where
the time inside the kernels goes, for MFU). Training's own defaults apply (on CUDA: compiled, bf16 autocast,
the images per GPU from the memory estimate; --batch-size and --compile override them). A scratch run
folder is written under the system's temporary folder and removed at the end.
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
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--batch-size", type=int, default=0, help="images a step (0: training's default)")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="auto: training's default")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = tempfile.mkdtemp(prefix="vqa-profile-train-")
    try:
        compiled = {"auto": None, "on": True, "off": False}[a.compile]
        t = Trainer(TrainConfig(data=a.data, out=out, preset=a.preset, max_steps=10**6, eval_images=0,
                                device=a.device, batch_size=a.batch_size or None, compile=compiled))
        batches, run, dev = t.batches(), t.runner, t.dist.device
        cuda = dev.type == "cuda"

        def now() -> float:
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        for _ in range(5):
            run(next(batches))
        parts: dict[str, list[float]] = {"data": [], "forward": [], "backward": [], "optimizer": []}
        losses = []
        for _ in range(a.steps):
            t0 = now()
            b = next(batches)[0]
            t1 = now()
            images, rows = run.normalize(b.images, b.jitter, dev), b.packed.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=run.amp_dtype or torch.float32, enabled=run.amp_dtype is not None):
                loss = run.fwd(images, rows)
            t2 = now()
            run.scaler.scale(loss).backward()
            t3 = now()
            run.scaler.step(t.optimizer)
            run.scaler.update()
            t.optimizer.zero_grad(set_to_none=True)
            t4 = now()
            losses.append(float(loss.detach()) / max(1.0, b.packed.weighted_targets))
            for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[k].append(v * 1000)
        total = sum(statistics.median(v) for v in parts.values())
        print(f"{a.preset}, {t.images_per_step} images a step, {torch.get_num_threads()} threads: "
              + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in parts.items())
              + f"; {total:.0f} ms a step, {t.images_per_step / total * 1000:.0f} images/s"
              + f"; loss per target {statistics.median(losses):.3f}")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(5):
                run(next(batches))
            now()
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=a.top))
        t.close()
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
