"""How well training and generation use the device: images/s, MFU, peak memory, operator calls, padding.

    python scripts/bench_gpu.py                                         # tiny, small, base; the default device
    python scripts/bench_gpu.py --presets base --batch 64,256 --compile off,on
    torchrun --nproc-per-node 8 scripts/bench_gpu.py --presets base --no-generate      # N GPUs (DDP)
    python scripts/bench_gpu.py --device cpu --presets tiny --batch 32 --compile off --repeats 3
    python scripts/bench_gpu.py --device cpu --threads 1 --lengths vqa2 --no-generate

Training rows run `vqa train`'s own step (vqa.train.step.StepRunner: the preset's optimizer, rows packed across
images as vqa.data.packing packs them, bf16 autocast on GPUs) on synthetic batches of N images x 4 questions +
1 caption (scripts/_bench_common.py; `--lengths vqa2`: VQA v2-like, 3-12 questions of ~14 tokens an image,
mean 5.4), N per device. For each row:
  images/s, step ms   median over --repeats steps after warm-up (all ranks: images/s is the total)
  MFU %               forward + backward FLOPs of the step (torch.utils.flop_counter) / time / peak, where peak
                      is the GPU's dense bf16 peak (a table by device name) or, on a CPU, the GEMM rate measured
                      at start (float32); nanoGPT's convention: the optimizer's arithmetic is not counted
  peak MiB            CUDA: max_memory_allocated in a step (weights, gradients, optimizer state, activations);
                      CPU: tensor memory allocated above the step's start
  ops / image         operator calls (aten::*, nested ones included) in one step under torch.profiler, per image;
                      kernels / image on CUDA: device kernels launched
  device busy %       CUDA: the step's kernel time / its wall time (low: the host, not the GPU, sets the pace)
  real tokens %       real tokens among the decoder's input tokens (the rest is padding)
  graphs, compile s   compiled rows: graphs built over --shapes batches of different shapes, and the first call's time
Generation rows: greedy and beam search (4 beams) from 12-token prompts, exactly 16 new tokens, batch 1 and 32;
float32 and bf16 weights on CUDA (as the Predictor runs them), with --gen-compiled also the compiled decode
step at batch 32 (CUDA graphs on a GPU); ms per call, and the host reads per generated token
(vqa.device.count_host_reads: tolist/item/bool/... of a device tensor, each a wait for the device).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time

import _bench_common as C  # first: it puts the checkout on sys.path
import torch
from torch.profiler import ProfilerActivity, profile

from vqa.decoding.generate import generate  # noqa: E402
from vqa.device import count_host_reads  # noqa: E402


def peak_flops(device, limits: dict | None) -> tuple[float | None, str]:
    if device.type == "cuda":
        peak, name = C.peak_bf16(device)
        return peak, f"{name} dense bf16 peak"
    return (limits or {}).get("gemm"), "measured float32 GEMM rate"


def batches(model, name: str, n: int, device, compile: bool, count: int, lengths: str = "fixed") -> list:
    """`count` training batches of n images each (different lengths), on the device."""
    out = []
    for k in range(count):
        b = C.train_batch(C.train_items(model.cfg, n, seed=1000 * k + int(os.environ.get("RANK", 0)), lengths=lengths),
                          name, compile)
        b.images = b.images.to(device)
        b.packed = b.packed.to(device)
        out.append(b)
    return out


def step_flops(model, batch) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        model(batch.images, batch.packed).backward()
    model.zero_grad(set_to_none=True)
    return float(fc.get_total_flops())


def profiled(fn, device) -> dict:
    """Operator calls, kernels and the device's busy time in one call of fn, under torch.profiler."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    C.sync(device)
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        fn()
        C.sync(device)
        wall = time.perf_counter() - t
    ops = kernels = 0
    busy = 0.0
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels += 1
            busy += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        elif e.name.startswith("aten::"):
            ops += 1
    return dict(ops=ops, kernels=kernels if device.type == "cuda" else None,
                busy=(busy / 1e6 / wall) if device.type == "cuda" else None)


def train_row(name: str, device, n: int, compile: bool, repeats: int, world: int, limits, n_shapes: int = 4,
              lengths: str = "fixed") -> dict:
    from torch._dynamo.utils import counters

    model = C.build_ours(name, device)
    runner, opt = C.step_runner(model, name, device, compile=compile)
    if world > 1:
        from vqa.train.step import wrap_ddp

        ddp = wrap_ddp(model, device, device.index or 0)
        runner.fwd, runner.ddp, runner.world = (torch.compile(ddp) if compile else ddp), ddp, world
    shapes = batches(model, name, n, device, compile, n_shapes if compile else 1, lengths)
    counters.clear()
    t0 = time.perf_counter()
    runner([shapes[0]])
    C.sync(device)
    first = time.perf_counter() - t0
    for b in shapes[1:] + shapes[:1]:  # every shape once more, then the timed one warm
        runner([b])
    graphs = counters["stats"]["unique_graphs"] if compile else None
    batch = shapes[0]
    times = [C.timed(lambda: runner([batch]), device) for _ in range(repeats)]
    t = C.median(times)
    prof = profiled(lambda: runner([batch]), device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        runner([batch])
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = C.tensor_peak(lambda: runner([batch]), device)
    fl = float("nan")
    with contextlib.suppress(Exception):  # FLOPs of the eager loss (the same arithmetic compiled)
        fl = step_flops(model, batch)
    real, total = batch.packed.real_tokens, batch.packed.input_ids.numel()
    pk, _ = peak_flops(device, limits)
    row = dict(preset=name, batch=n, world=world, compile=compile, lengths=lengths, step_ms=t * 1e3,
               images_per_s=n * world / t,
               gflop_per_image=fl / n / 1e9, mfu=100 * fl / t / pk if pk else None, peak_mib=peak / 2**20,
               ops_per_image=prof["ops"] / n,
               kernels_per_image=None if prof["kernels"] is None else prof["kernels"] / n,
               busy=prof["busy"], real_tokens=real / total, graphs=graphs, first_s=first,
               params_m=model.num_parameters() / 1e6)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def gen_rows(name: str, device, repeats: int, compiled: bool = False) -> list[dict]:
    fp32 = C.build_ours(name, device).eval()
    s = fp32.cfg.vit_image_size
    rows = []
    # bf16 as the Predictor runs it: the weights converted (vqa.decoding.precision.apply_precision), no autocast
    models = {"fp32": fp32} | ({"bf16": copy.deepcopy(fp32).to(torch.bfloat16)} if device.type == "cuda" else {})
    for b in (1, 32):
        pixels = torch.randn(b, 3, s, s, generator=torch.Generator().manual_seed(3)).to(device)
        prompts = C.prompts(b)
        for method, beams in (("greedy", 1), ("beam", 4)):
            last = list(models)[-1]
            variants = [(dt, False) for dt in models] + ([(last, True)] if compiled and b > 1 else [])
            for dt, comp in variants:
                model = models[dt]

                def run(method=method, beams=beams, model=model, images=pixels.to(next(model.parameters()).dtype),
                        prompts=prompts, comp=comp):
                    generate(model, prompts, images, method=method, num_beams=beams, compile=comp,
                             max_new_tokens=C.NEW_TOKENS, min_new_tokens=C.NEW_TOKENS)
                t0 = time.perf_counter()
                run()
                first = time.perf_counter() - t0
                t = C.median([C.timed(run, device) for _ in range(repeats)])
                with count_host_reads() as syncs:
                    run()
                rows.append(dict(preset=name, batch=b, method=method, dtype=dt + (" compiled" if comp else ""),
                                 ms=t * 1e3, first_s=first,
                                 tokens_per_s=b * C.NEW_TOKENS / t, syncs_per_token=syncs.count / C.NEW_TOKENS))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,small,base")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", default="", help="images per device, comma-separated (default: cpu 32, cuda 64,256)")
    p.add_argument("--compile", default="off,on", help="off, on or both (compiled rows at the largest batch only)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--lengths", default="fixed", choices=C.LENGTHS,
                   help="text rows: fixed (4 questions of 12-17 tokens + 1 caption an image) or vqa2 (VQA v2-like, "
                   "varying)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--shapes", type=int, default=4, help="compiled rows: batch shapes run before timing")
    p.add_argument("--no-generate", action="store_true", help="training rows only")
    p.add_argument("--gen-compiled", action="store_true",
                   help="also generation through the compiled decode step (CUDA graphs on a GPU) at batch 32")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        from vqa import distributed

        dist = distributed.setup(a.device)
        device = dist.device
    else:
        device = C.pick_device(a.device)
    main_rank = int(os.environ.get("RANK", 0)) == 0
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    limits = C.machine_limits(device) if device.type == "cpu" else None
    _, peak_what = peak_flops(device, limits)
    sizes = [int(x) for x in (a.batch or ("64,256" if device.type == "cuda" else "32")).split(",")]
    modes = [m == "on" for m in a.compile.split(",")]
    train, gen = [], []
    for name in a.presets.split(","):
        t0 = time.time()
        for compiled in modes:
            for n in sizes[-1:] if compiled else sizes:
                try:
                    train.append(train_row(name, device, n, compiled, a.repeats, world, limits, a.shapes, a.lengths))
                except torch.OutOfMemoryError:
                    train.append(dict(preset=name, batch=n, compile=compiled, oom=True))
                    torch.cuda.empty_cache()
                if main_rank:
                    print(json.dumps(train[-1]), file=sys.stderr, flush=True)
        if not a.no_generate and main_rank:
            gen += gen_rows(name, device, a.repeats, a.gen_compiled)
            print("\n".join(json.dumps(r) for r in gen if r["preset"] == name), file=sys.stderr, flush=True)
        if main_rank:
            print(f"[{name}] {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    if not main_rank:
        return 0
    f = lambda v, nd=1: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
    print(f"\n{C.environment(device)} x {world}; MFU against the {peak_what}"
          + (f" ({limits['gemm'] / 1e9:.0f} GFLOP/s)" if limits else "") + f"; median of {a.repeats} steps\n")
    print(C.table(["preset", "images/device", "compiled", "images/s", "step ms", "MFU %", "GFLOP/image", "peak MiB",
                   "ops/image", "kernels/image", "device busy %", "real tokens %", f"graphs ({a.shapes} shapes)",
                   "first step s"],
                  [[r["preset"], r["batch"], "yes" if r["compile"] else "no"]
                   + (["OOM"] + [""] * 10 if r.get("oom") else
                      [f(r["images_per_s"], 0), f(r["step_ms"]), f(r["mfu"]), f(r["gflop_per_image"], 2),
                       f(r["peak_mib"], 0), f(r["ops_per_image"]), f(r["kernels_per_image"]),
                       f(None if r["busy"] is None else 100 * r["busy"], 0), f(100 * r["real_tokens"], 0),
                       "-" if r["graphs"] is None else r["graphs"], f(r["first_s"])]) for r in train]))
    if gen:
        print("\n" + C.table(["preset", "batch", "method", "dtype", "ms", "tokens/s", "host reads / token",
                              "first call s"],
                             [[r["preset"], r["batch"], r["method"], r["dtype"], f(r["ms"], 2), f(r["tokens_per_s"], 0),
                               f(r["syncs_per_token"], 2), f(r["first_s"], 1)] for r in gen]))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(environment=C.environment(device), world=world, peak=peak_what, train=train,
                           generate=gen), fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
