"""Training and generation speed of the presets on this machine.

    .venv/bin/python scripts/bench.py                        # tiny and small on the default device
    .venv/bin/python scripts/bench.py --presets tiny --repeats 10 --json bench.json
    .venv/bin/python scripts/bench.py --device cuda --mem-table --compile
    .venv/bin/python scripts/bench.py --gen-variants eager            # generation without the compiled variants

Measures (medians over --repeats after warm-up):
  train images/s    vqa train's own step (vqa.train.step.StepRunner) with the preset's optimizer (tiny: Muon +
                    AdamW) on a synthetic batch shaped like VQA + captions: images x (4 questions of 10-14
                    prompt tokens + a 2-3 token answer + <eos>, and 1 caption of 8-14 tokens), vocabulary
                    1000, rows packed across images as vqa train's collate function does; bf16 autocast on CUDA. Data
                    loading is not included (scripts/bench_data.py measures it)
  step GFLOP        forward + backward FLOPs of that step (torch.utils.flop_counter), the MFU numerator
  host syncs        operations in one step that would make the host wait for a CUDA device (counted on any
                    device with vqa.train.step.count_syncs); vqa train reads the loss once per logged step
  compiled graphs   with --compile: graphs torch.compile built over 8 batches of different shapes
  generate          greedy, exactly 16 new tokens (min_new_tokens=16), 12-token prompts; batch 1 and 32, one
                    image per prompt; the latency includes encoding the images. Variants (--gen-variants):
                    eager (generate's default), compiled (generate(compile=True): the torch.compile'd decode
                    step, weights frozen in) and int8 (dynamic int8 linear layers, vqa.decoding.precision, compiled step
                    and encoder; CPU only). The compiling time (first call) is reported, not timed
  physical bound    beside every generation figure: the least time the machine allows for that generation,
                    from its FLOPs at the measured GEMM rate and its bytes at the measured memory bandwidth
                    (measured at the start; _bench_common.machine_limits / generation_bound), and how far
                    the figure is from it
  decode step       one cached decode step at batch 1 at position 1 and at position 64 (the model is built with
                    dec_max_len=80 for this: the presets' 48/64 have no position 64); about equal when the cache
                    works; for reference, the uncached pass over 65 tokens a decoder without a cache would pay
  peak memory       tensor memory allocated above what was live before: CUDA max_memory_allocated, CPU the
                    allocation records of torch.profiler(profile_memory=True) (one extra, untimed run);
                    --mem-table on CUDA reports all allocated memory (weights, gradients, AdamW state too)
  CUDA only         training tokens/s and MFU (step GFLOP / time / the GPU's dense bf16 peak), and with
                    --mem-table the peak memory of a training step per batch size
"""

from __future__ import annotations

import argparse
import sys
import time

import _bench_common as C  # first: it puts the checkout on sys.path
import torch

from vqa.config import GenerationConfig  # noqa: E402
from vqa.decoding.batch import DecodingBatch
from vqa.decoding.generate import generate


def peak_flops(device) -> float | None:
    return C.peak_bf16(device)[0] if device.type == "cuda" else None


def step_flops(model, batch) -> float:
    """FLOPs of one training step's forward and backward, counted by torch.utils.flop_counter (matmuls,
    convolutions including tiny's conv stem, attention); the optimizer's own arithmetic is left out, as MFU
    conventionally does."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        model(batch.images, batch.packed).backward()
    model.zero_grad(set_to_none=True)
    return float(fc.get_total_flops())


def train_images(name: str, device) -> int:
    small = C.preset_image_size(name) > 100
    return (8 if small else 32) if device.type == "cpu" else (64 if small else 256)


def bench_train(name, device, n_img, repeats, compile):
    """vqa train's step (StepRunner: the preset's optimizer, rows packed across images, sync-free scaling) on synthetic
    batches of n_img images x 4 questions + 1 caption; also its host syncs and, compiled, its graph count over
    8 differently shaped batches."""
    from torch._dynamo.utils import counters

    from vqa.train.step import count_syncs, host_tensors

    model = C.build_ours(name, device)
    runner, opt = C.step_runner(model, name, device, compile=compile)
    batches = [C.train_batch(C.train_items(model.cfg, n_img, seed=k), name, compile) for k in range(8)]
    counters.clear()
    for b in batches if compile else batches[:2]:  # warm-up (and, compiled, every shape once)
        runner([b])
    graphs = counters["stats"]["unique_graphs"] if compile else None
    batch = batches[0]
    times = [C.timed(lambda: runner([batch]), device) for _ in range(repeats)]
    with count_syncs(ignore=host_tensors(opt)) as syncs:
        runner([batch])
    mem = C.tensor_peak(lambda: runner([batch]), device)
    t = C.median(times)
    fl = step_flops(model, batch)
    row = dict(train_images_per_s=n_img / t, train_step_ms=t * 1e3,
               train_batch=f"{n_img} img x {C.QUESTIONS} q + 1 cap", train_peak_mib=mem / 2**20,
               params_m=model.num_parameters() / 1e6, train_gflop=fl / 1e9, train_syncs=syncs.count,
               train_graphs=graphs, optimizer=type(opt).__name__)
    if device.type == "cuda":
        row["train_tokens_per_s"] = batch.packed.real_tokens / t  # no padding
        peak = peak_flops(device)
        row["train_tflops"] = fl / t / 1e12
        row["mfu_percent"] = 100 * fl / t / peak if peak else None
    return model, row


VARIANTS = ("eager", "compiled", "int8")


def bench_generate(model, device, batch, repeats, variant="eager"):
    """Greedy generation latency of `variant` (keys gen_b{batch}[_{variant}]_...); compiled variants are
    compiled (and the compiling timed) before the timed runs."""
    model.eval()
    s = model.cfg.vit_image_size
    images = torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(3)).to(device)
    prompts = C.prompts(batch)
    dt = C.amp_dtype(device)
    compile = variant != "eager"

    def run():
        with torch.autocast(device.type, dtype=dt or torch.float32, enabled=dt is not None):
            generate(model, prompts, images, max_new_tokens=C.NEW_TOKENS, min_new_tokens=C.NEW_TOKENS,
                     compile=compile)

    first = C.timed(run, device)
    run()
    t = C.median([C.timed(run, device) for _ in range(repeats)])
    key = f"gen_b{batch}" + ("" if variant == "eager" else f"_{variant}")
    out = {f"{key}_ms": t * 1e3, f"{key}_tokens_per_s": batch * C.NEW_TOKENS / t, f"{key}_first_s": first}
    if variant == "eager":
        out[f"{key}_peak_mib"] = C.tensor_peak(run, device) / 2**20
    return out


def variant_model(model, variant):
    """The model a generation variant runs: the same one, or an int8 copy (vqa.decoding.precision)."""
    if variant != "int8":
        return model
    import copy

    from vqa.decoding.precision import quantize_int8

    q = copy.deepcopy(model).eval()
    quantize_int8(q)
    return q


def bench_positions(name, device, repeats, positions=(1, 64)):
    """One cached decode step at batch 1 feeding the token at each position (the prefill is not timed)."""
    model = C.build_ours(name, device, dec_max_len=max(positions) + 16).eval()
    s = model.cfg.vit_image_size
    with torch.inference_mode():
        kv = model.memory_kv(model.encode(torch.randn(1, 3, s, s, device=device)))
        tok = torch.tensor([5], device=device)
        out = {}
        for p in positions:
            prompt = [[C.BOS] + [7] * (p - 1)]  # p tokens at positions 0..p-1: the step feeds position p
            times = []
            for _ in range(repeats * 4):
                two = GenerationConfig(max_new_tokens=2)
                dec, warm = DecodingBatch(model, kv, prompt, two), DecodingBatch(model, kv, prompt, two)
                warm.step(tok)  # the same step just before, as in a decoding loop: weights warm in the caches
                times.append(C.timed(lambda dec=dec: dec.step(tok), device))
            out[f"step_pos{p}_ms"] = C.median(times) * 1e3
        # what a decoder without a cache pays for the token at the last position: a pass over all of them
        ids = torch.tensor([[C.BOS] + [7] * max(positions)], device=device)
        last = lambda: model.decoder.logits(model.decoder(ids, kv)[0][:, -1])  # noqa: E731
        out[f"uncached_pos{max(positions)}_ms"] = C.median([C.timed(last, device) for _ in range(repeats * 4)]) * 1e3
    return out


def mem_table(name, device, sizes):
    rows = []
    for n in sizes:
        try:
            peak = _train_peak(name, device, n)
        except torch.OutOfMemoryError:
            rows.append([name, n, "OOM"])
            break
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append([name, n, C.mib(peak)])
    return rows


def _train_peak(name, device, n) -> int:
    model = C.build_ours(name, device)
    runner, _ = C.step_runner(model, name, device)
    batch = C.train_batch(C.train_items(model.cfg, n), name)
    runner([batch])  # the optimizer state exists after the first step
    if device.type != "cuda":
        return C.tensor_peak(lambda: runner([batch]), device)  # above the start of the step: activations + grads
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    runner([batch])
    return torch.cuda.max_memory_allocated()  # everything: weights, grads, optimizer state, activations


def readiness(name, device, compile) -> dict:
    """What a GPU run of the preset's training step would do, counted (not timed) on any device: forward +
    backward FLOPs per image, host syncs per step, and with `compile` the graphs built over 8 batch shapes."""
    from torch._dynamo.utils import counters

    from vqa.train.step import count_syncs, host_tensors

    model = C.build_ours(name, device)
    runner, opt = C.step_runner(model, name, device, compile=compile)
    batches = [C.train_batch(C.train_items(model.cfg, 4, seed=k), name, compile) for k in range(8)]
    counters.clear()
    for b in batches if compile else batches[:2]:
        runner([b])
    with count_syncs(ignore=host_tensors(opt)) as syncs:
        runner([batches[0]])
    return dict(preset=name, optimizer=type(opt).__name__, params_m=model.num_parameters() / 1e6,
                gflop_per_image=step_flops(model, batches[0]) / 4 / 1e9, syncs=syncs.count,
                graphs=counters["stats"]["unique_graphs"] if compile else None,
                graph_breaks=sum(counters["graph_break"].values()) if compile else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model for the training step")
    p.add_argument("--mem-table", action="store_true", help="peak training memory per batch size")
    p.add_argument("--gen-variants", default=",".join(VARIANTS),
                   help=f"generation variants to time, of {','.join(VARIANTS)} (int8: CPU only)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--readiness", action="store_true",
                   help="only count (no timing): FLOPs per image, host syncs per step, compiled graphs (--compile)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = C.pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.readiness:
        rows = [readiness(name, device, args.compile) for name in args.presets.split(",")]
        show = lambda v: "-" if v is None else v  # noqa: E731
        print(C.table(["preset", "params (M)", "optimizer", "GFLOP per image (fwd + bwd)", "host syncs per step",
                       "compiled graphs / breaks (8 batch shapes)"],
                      [[r["preset"], f"{r['params_m']:.1f}", r["optimizer"], f"{r['gflop_per_image']:.2f}",
                        r["syncs"], f"{show(r['graphs'])} / {show(r['graph_breaks'])}"] for r in rows]))
        if args.json:
            C.write_json(args.json, device, 0, readiness=rows)
        return 0
    variants = [v for v in args.gen_variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown --gen-variants {','.join(bad)}; choose from {','.join(VARIANTS)}")
    if device.type != "cpu" and "int8" in variants:
        print("bench.py: int8 is for CPUs; leaving it out", file=sys.stderr)
        variants.remove("int8")
    limits = C.machine_limits(device)
    print(f"machine: {limits['bandwidth'] / 1e9:.1f} GB/s memory read, {limits['gemm'] / 1e9:.0f} GFLOP/s GEMM "
          f"({'bf16' if device.type == 'cuda' else 'float32'})", file=sys.stderr)
    results = []
    for name in args.presets.split(","):
        t0 = time.time()
        model, row = bench_train(name, device, train_images(name, device), args.repeats, args.compile)
        model.eval()
        for b in (1, 32):
            bound = C.generation_bound(model, device, b, limits)
            row[f"gen_b{b}_bound_ms"] = bound["bound_ms"]
            row[f"gen_b{b}_bound_parts"] = bound
        for variant in variants:
            vmodel = variant_model(model, variant)
            for b in (1, 32):
                row.update(bench_generate(vmodel, device, b, args.repeats, variant))
            del vmodel
        del model
        row.update(bench_positions(name, device, args.repeats))
        results.append(dict(preset=name, **row))
        print(f"[{name}] {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"\n{C.environment(device)}, median of {args.repeats} repeats; machine: "
          f"{limits['bandwidth'] / 1e9:.1f} GB/s memory read, {limits['gemm'] / 1e9:.0f} GFLOP/s GEMM\n")
    f = lambda v, nd=1: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
    gen = lambda r, k, b: (f"{f(r[k])} ({f(r[f'gen_b{b}_bound_ms'])}, {r[k] / r[f'gen_b{b}_bound_ms']:.1f}x)"  # noqa: E731
                           if k in r else "-")
    cols = ["preset", "params (M)", "train img/s (batch)", "train peak MiB", "generate b1 ms (bound, x bound)",
            "generate b32 ms (bound, x bound)", "b32 tokens/s", "gen peak MiB b1 / b32",
            "decode step ms pos 1 / 64 (no cache: 64)"]
    rows = [[r["preset"], f(r["params_m"]), f"{f(r['train_images_per_s'])} ({r['train_batch']})",
             f(r["train_peak_mib"]),
             gen(r, "gen_b1_ms", 1), gen(r, "gen_b32_ms", 32), f(r.get("gen_b32_tokens_per_s"), 0),
             f"{f(r.get('gen_b1_peak_mib'))} / {f(r.get('gen_b32_peak_mib'))}",
             f"{f(r['step_pos1_ms'], 2)} / {f(r['step_pos64_ms'], 2)} ({f(r['uncached_pos64_ms'], 2)})"]
            for r in results]
    print(C.table(cols, rows))
    vrows = [[r["preset"], v] + [gen(r, f"gen_b{b}{'' if v == 'eager' else '_' + v}_ms", b) for b in (1, 32)]
             + [f(r.get(f"gen_b{b}{'' if v == 'eager' else '_' + v}_first_s")) for b in (1, 32)]
             for r in results for v in variants]
    print("\n" + C.table(["preset", "generation", "b1 ms (bound, x bound)", "b32 ms (bound, x bound)",
                          "first call s b1", "first call s b32 (compiling)"], vrows))
    print("\n" + C.table(["preset", "batch", "bound ms", "encode ms", "prefill ms", "per step ms",
                          "encode GFLOP", "MB read per step"],
                         [[r["preset"], b, f(p["bound_ms"]), f(p["encode_ms"], 2), f(p["prefill_ms"], 2),
                           f(p["step_ms"], 3), f(p["encode_gflop"], 2), f(p["step_mb"])]
                          for r in results for b in (1, 32) for p in [r[f"gen_b{b}_bound_parts"]]]))
    print("\n" + C.table(["preset", "optimizer", "step GFLOP (fwd + bwd)", "host syncs in a step",
                          "compiled graphs (8 batch shapes)"],
                         [[r["preset"], r["optimizer"], f(r["train_gflop"], 2), r["train_syncs"],
                           "-" if r["train_graphs"] is None else r["train_graphs"]] for r in results]))
    if device.type == "cuda":
        print("\n" + C.table(["preset", "train tokens/s", "train TFLOP/s", "MFU % (bf16 peak)"],
                             [[r["preset"], f(r["train_tokens_per_s"], 0), f(r["train_tflops"]), f(r["mfu_percent"])]
                              for r in results]))
    if args.mem_table:
        sizes = [4, 8, 16, 32, 64] if device.type == "cpu" else [16, 32, 64, 128, 256, 512, 1024]
        mem_rows = [r for name in args.presets.split(",") for r in mem_table(name, device, sizes)]
        what = "max_memory_allocated, all of it" if device.type == "cuda" else "tensor peak above the step's start"
        print("\n" + C.table(["preset", f"images (x {C.QUESTIONS} q)", f"train step peak MiB ({what})"], mem_rows))
        results.append(dict(mem_table=mem_rows))
    if args.json:
        C.write_json(args.json, device, args.repeats, limits=limits, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
