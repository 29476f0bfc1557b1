"""Peak training memory and step time with the memory savers: plain, --grad-checkpointing, --lora-rank 16, and
both, on `vqa train`'s own step (vqa.train.step.StepRunner, the preset's optimizer) and batch layout.

    .venv/bin/python scripts/bench_memory.py --presets tiny,small --batch 8
    .venv/bin/python scripts/bench_memory.py --device cuda --presets small,base --batch 32

Columns: trained parameters; "weights + state": the bytes of every parameter plus the optimizer's state after a
step; "step peak": tensor memory a step allocates above what was live when it began (activations and gradients;
CPU: torch.profiler's allocation records, CUDA: max_memory_allocated), scripts/_bench_common.tensor_peak;
"total": the two together; "estimated": what `vqa train` prints before it starts on a GPU
(vqa.train.build.estimated_bytes); the median step time over --repeats steps after one warm-up step, and the
images a second it gives. Presets whose towers start from downloaded weights are built with random ones (the same
shapes: nothing is downloaded).

    .venv/bin/python scripts/bench_memory.py --device cuda --presets base-smollm2 --batch 32"""

from __future__ import annotations

import argparse
import statistics
import time

import _bench_common as C  # first: it puts the checkout on sys.path
import torch

from vqa.config import TrainConfig  # noqa: E402
from vqa.train.build import estimated_bytes, memory_options  # noqa: E402

VARIANTS = {"plain": {}, "checkpointing": dict(grad_checkpointing=True), "lora 16": dict(lora_rank=16),
            "lora 16 + checkpointing": dict(lora_rank=16, grad_checkpointing=True)}


def measure(name: str, device, batch: int, options: dict, repeats: int) -> list:
    model = C.build_ours(name, device)
    memory_options(TrainConfig(**options), model)
    runner, opt = C.step_runner(model, name, device)
    step = C.train_batch(C.train_items(model.cfg, batch), name)
    runner([step])  # the optimizer state exists after the first step
    state = _tensor_bytes(opt.state_dict())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = C.tensor_peak(lambda: runner([step]), device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        runner([step]).tolist()  # waits for the step
        times.append(time.perf_counter() - t0)
    trained = model.num_parameters(trainable_only=True)
    estimate = estimated_bytes(model, batch, bool(options.get("grad_checkpointing")))
    sec = statistics.median(times)
    return [name, batch, f"{trained / 1e6:.2f} M", C.mib(weights + state), C.mib(peak),
            C.mib(weights + state + peak), C.mib(estimate), f"{sec:.3f}", f"{batch / sec:.1f}"]


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor in a nested state dict (AdamW's, or Muon + AdamW's pair of them)."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = []
    for name in args.presets.split(","):
        for label, options in VARIANTS.items():
            rows.append([label, *measure(name, device, args.batch, options, args.repeats)])
    print(C.table(["variant", "preset", "images", "trained", "weights + state MiB", "step peak MiB", "total MiB",
                   "estimated MiB", "s / step", "images/s"], rows), flush=True)


if __name__ == "__main__":
    main()
