"""Training and generation speed of the presets on this machine.

    .venv/bin/python scripts/bench.py                        # tiny and small on the default device
    .venv/bin/python scripts/bench.py --presets tiny --repeats 10 --json bench.json
    .venv/bin/python scripts/bench.py --device cuda --mem-table --compile

Measures (medians over --repeats after warm-up):
  train images/s    a VQA-shaped batch: images x 4 questions of 10-14 prompt tokens + a 2-3 token answer +
                    <eos> (vocabulary 1000); forward with loss_mask and image_index, backward, clip, AdamW, as
                    vqa.train does (bf16 autocast on CUDA)
  generate          greedy, exactly 16 new tokens (min_new_tokens=16), 12-token prompts; batch 1 and 32, one
                    image per prompt; the latency includes encoding the images
  decode step       one cached decode step at batch 1 at position 1 and at position 64 (the model is built with
                    dec_max_len=80 for this: the presets' 48/64 have no position 64); about equal when the cache
                    works; for reference, the uncached pass over 65 tokens a decoder without a cache would pay
  peak memory       tensor memory allocated above what was live before: CUDA max_memory_allocated, CPU the
                    allocation records of torch.profiler(profile_memory=True) (one extra, untimed run);
                    --mem-table on CUDA reports all allocated memory (weights, gradients, AdamW state too)
  CUDA only         training tokens/s and MFU (see flops_per_step), and with --mem-table the peak memory of a
                    training step per batch size
"""

from __future__ import annotations

import argparse
import sys
import time

import _bench_common as C  # first: it puts the checkout on sys.path
import torch

from vqa.config import GenerationConfig  # noqa: E402
from vqa.generate import _Decoder, generate

# dense bf16 peak FLOP/s (no sparsity) by a substring of torch.cuda.get_device_name()
PEAK_BF16 = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("A100", 312e12),
             ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12), ("RTX 4090", 165e12),
             ("RTX 3090", 71e12), ("V100", 125e12), ("T4", 65e12)]


def peak_flops(device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((f for key, f in PEAK_BF16 if key in name), None)


def flops_per_step(model, batch) -> float:
    """Matmul FLOPs of one training step, 3 x forward (backward = 2 x forward); norms, softmax and elementwise
    ops are left out. Forward, with N image tokens, M images, B rows of T tokens, K target tokens:
      ViT     M * [Lv * (2 N (4 + 2 r) dv^2  +  4 N^2 dv)  +  2 N 3 p^2 dv]   (QKV+proj, MLP, QK^T and AV, patch)
      bridge  2 M N dv D  +  Ld * 2 M N 2 D^2                                  (projection, cross K/V once per image)
      decoder B * Ld * [2 T (4 + 2 + 2 r) D^2  +  4 T^2 D  +  4 T N D]         (self QKV+proj, cross Q+proj, MLP,
                                                                               self and cross attention)
      head    2 K D V                                                         (LM head on the targets only)"""
    c, vit = model.cfg, model.vision.vit
    dv, lv, r = vit.embed_dim, len(vit.blocks), c.dec_mlp_ratio
    n = model.vision.grid ** 2 + (model.vision.num_prefix if c.vit_keep_prefix else 0)
    m, (b, t) = batch["images"].shape[0], batch["input_ids"].shape
    d, ld, k = c.dec_width, c.dec_depth, int(batch["loss_mask"][:, 1:].sum())
    vit_f = m * (lv * (2 * n * (4 + 2 * r) * dv**2 + 4 * n * n * dv) + 2 * n * 3 * c.vit_patch_size**2 * dv)
    bridge = 2 * m * n * dv * d + ld * 2 * m * n * 2 * d * d
    dec = b * ld * (2 * t * (6 + 2 * r) * d * d + 4 * t * t * d + 4 * t * n * d)
    return 3 * (vit_f + bridge + dec + 2 * k * d * c.vocab_size)


def train_images(name: str, device) -> int:
    small = C.preset_image_size(name) > 100
    return (8 if small else 32) if device.type == "cpu" else (64 if small else 256)


def bench_train(name, device, n_img, repeats, compile):
    model = C.build_ours(name, device)
    batch = C.vqa_batch(model.cfg, n_img, device)
    step = C.ours_trainer(model, device, compile=compile)
    for _ in range(2 if not compile else 3):
        step(batch)
    times = [C.timed(lambda: step(batch), device) for _ in range(repeats)]
    mem = C.tensor_peak(lambda: step(batch), device)
    t = C.median(times)
    row = dict(train_images_per_s=n_img / t, train_step_ms=t * 1e3, train_batch=f"{n_img} img x {C.QUESTIONS} q",
               train_peak_mib=mem / 2**20, params_m=model.num_parameters() / 1e6)
    if device.type == "cuda":
        row["train_tokens_per_s"] = int((batch["input_ids"] != C.PAD).sum()) / t  # text tokens, padding excluded
        peak = peak_flops(device)
        fl = flops_per_step(model, batch)
        row["train_tflops"] = fl / t / 1e12
        row["mfu_percent"] = 100 * fl / t / peak if peak else None
    return model, row


def bench_generate(model, device, batch, repeats):
    model.eval()
    s = model.cfg.vit_image_size
    images = torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(3)).to(device)
    prompts = C.prompts(batch)
    dt = C.amp_dtype(device)

    def run():
        with torch.autocast(device.type, dtype=dt or torch.float32, enabled=dt is not None):
            generate(model, prompts, images, max_new_tokens=C.NEW_TOKENS, min_new_tokens=C.NEW_TOKENS)

    for _ in range(2):
        run()
    t = C.median([C.timed(run, device) for _ in range(repeats)])
    mem = C.tensor_peak(run, device)
    return {f"gen_b{batch}_ms": t * 1e3, f"gen_b{batch}_tokens_per_s": batch * C.NEW_TOKENS / t,
            f"gen_b{batch}_peak_mib": mem / 2**20}


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
                dec, warm = _Decoder(model, kv, prompt, two), _Decoder(model, kv, prompt, two)
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
    batch = C.vqa_batch(model.cfg, n, device)
    step = C.ours_trainer(model, device)
    step(batch)  # the optimizer state exists after the first step
    if device.type != "cuda":
        return C.tensor_peak(lambda: step(batch), device)  # above the start of the step: activations + grads
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(batch)
    return torch.cuda.max_memory_allocated()  # everything: weights, grads, AdamW state, activations


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model for the training step")
    p.add_argument("--mem-table", action="store_true", help="peak training memory per batch size")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = C.pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    results = []
    for name in args.presets.split(","):
        t0 = time.time()
        model, row = bench_train(name, device, train_images(name, device), args.repeats, args.compile)
        for b in (1, 32):
            row.update(bench_generate(model, device, b, args.repeats))
        del model
        row.update(bench_positions(name, device, args.repeats))
        results.append(dict(preset=name, **row))
        print(f"[{name}] {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"\n{C.environment(device)}, median of {args.repeats} repeats\n")
    f = lambda v, nd=1: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
    cols = ["preset", "params (M)", "train img/s (batch)", "train peak MiB", "generate b1 ms", "generate b32 ms",
            "b32 tokens/s", "gen peak MiB b1 / b32", "decode step ms pos 1 / 64 (no cache: 64)"]
    rows = [[r["preset"], f(r["params_m"]), f"{f(r['train_images_per_s'])} ({r['train_batch']})", f(r["train_peak_mib"]),
             f(r["gen_b1_ms"]), f(r["gen_b32_ms"]), f(r["gen_b32_tokens_per_s"], 0),
             f"{f(r['gen_b1_peak_mib'])} / {f(r['gen_b32_peak_mib'])}", f"{f(r['step_pos1_ms'], 2)} / {f(r['step_pos64_ms'], 2)} ({f(r['uncached_pos64_ms'], 2)})"]
            for r in results]
    print(C.table(cols, rows))
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
        C.write_json(args.json, device, args.repeats, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
