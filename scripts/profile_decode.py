"""Where a decode step's time goes: torch.profiler over cached decode steps, grouped by kind of work.

    .venv/bin/python scripts/profile_decode.py                                 # tiny and small, batch 1 and 32
    .venv/bin/python scripts/profile_decode.py --presets tiny --batches 1 --variants eager --top 20

For each preset, batch size and variant (eager: `decode_step` as generate runs it by default; compiled: the
torch.compile'd step of `generate(compile=True)`; int8: that with dynamic int8 linear layers), it times steps
without the profiler (median), then profiles --steps steps and splits the profiled time into:

  matmul       the linear layers and the LM head (aten addmm / mm / linear, MKL / oneDNN linear, int8 matmuls)
  attention    scaled_dot_product_attention (self and cross)
  norm         LayerNorm
  elementwise  adds, GELU, scaling, softmax, argmax, ...
  fused        the compiled graph's own C++ kernels (norms, elementwise work, cache writes fused together,
               and the matmuls inductor generated itself; its calls into MKL / oneDNN count as matmul)
  memory       cache writes, copies, allocations, views (as_strided, view, transpose, empty, copy_, ...)
  dispatch     what no operator accounts for: Python, module calls, the compiled graph's guards and wrapper --
               the step's wall time minus all of the above

Built like scripts/bench.py's models (like for like with the peer: no conv stem, no QK-norm), 12-token prompts.
The figures are for the machine it runs on.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections import defaultdict

import _bench_common as C  # first: it puts the checkout on sys.path
import torch

from vqa.config import GenerationConfig  # noqa: E402
from vqa.decoding.batch import DecodingBatch  # noqa: E402

LIKE_FOR_LIKE = dict(vit_conv_stem=False, vit_qk_norm=False, dec_qk_norm=False, vit_memory_pos=False)
KINDS = ("matmul", "attention", "norm", "elementwise", "fused", "memory", "dispatch")
MATMUL = ("addmm", "aten::mm", "aten::bmm", "linear", "_int_mm", "qlinear", "mkl_linear", "matmul")
MEMORY = ("copy", "index_copy", "index_fill", "empty", "as_strided", "view", "transpose", "permute", "reshape",
          "expand", "select", "slice", "unsqueeze", "squeeze", "unbind", "clone", "contiguous", "resolve", "detach",
          "lift_fresh", "alias", "t")


def kind(name: str) -> str:
    n = name.lower()
    if any(m in n for m in MATMUL):
        return "matmul"
    if "scaled_dot_product" in n or "flash_attention" in n:
        return "attention"
    if "layer_norm" in n:
        return "norm"
    bare = n.removeprefix("aten::").split(".")[0]
    if bare in MEMORY or any(bare.startswith(m) for m in MEMORY if len(m) > 2):
        return "memory"
    return "elementwise"


def decoder(model, batch: int, compiled: bool) -> tuple[DecodingBatch, torch.Tensor]:
    s = model.cfg.vit_image_size
    with torch.inference_mode():  # as generate() runs
        kv = model.memory_kv(model.encode(torch.randn(batch, 3, s, s)))
        dec = DecodingBatch(model, kv, C.prompts(batch), GenerationConfig(max_new_tokens=40), compiled=compiled)
        return dec, torch.full((batch,), 5)


def profile_steps(model, batch: int, variant: str, steps: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile, schedule

    compiled = variant != "eager"
    dec, tok = decoder(model, batch, compiled)
    times = []
    with torch.inference_mode():
        for _ in range(3):  # warm-up (and compiling)
            dec.step(tok)
        for _ in range(steps):
            times.append(C.timed(lambda: dec.step(tok), torch.device("cpu")))
        dec, tok = decoder(model, batch, compiled)
        dec.step(tok)
        sys.stderr.flush()
        saved = os.dup(2)  # the profiler's C++ side logs every start/stop on stderr
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 2)
                # the first profiled calls pay the profiler's own start-up: they are warm-up, not recorded
                with profile(activities=[ProfilerActivity.CPU],
                             schedule=schedule(wait=0, warmup=3, active=steps, repeat=1)) as prof:
                    for _ in range(steps + 3):
                        dec.step(tok)
                        prof.step()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    per_kind, per_op, ops = defaultdict(float), defaultdict(lambda: [0.0, 0]), 0
    events = [e for e in prof.events() if not e.name.startswith("ProfilerStep")]
    span = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)  # µs, profiled
    profiled_wall = span * steps / max(1, steps - 1)  # the span runs from the first op to the last op
    for e in events:
        ops += 1
        per_op[e.name][0] += e.self_cpu_time_total
        per_op[e.name][1] += 1
        if e.name.startswith("## Call CompiledFxGraph"):
            per_kind["fused"] += e.self_cpu_time_total  # inside it, only the extern calls are operators
        elif e.name.startswith(("Torch-Compiled Region", "TorchDynamo", "Pregraph", "AOTDispatcher",
                                "CompiledFunction")):
            continue  # the compiled graph's guards and wrappers: dispatch (the remainder below)
        else:
            per_kind[kind(e.name)] += e.self_cpu_time_total
    # each kind's share of the profiled wall time, applied to the unprofiled one; dispatch is what is left
    wall = C.median(times) * 1e6
    share = {k: min(1.0, per_kind[k] / profiled_wall) for k in KINDS if k != "dispatch"}
    row = {k: share[k] * wall for k in share}
    row["dispatch"] = max(0.0, wall - sum(row.values()))
    row.update(wall_us=wall, ops_per_step=ops / steps)
    row["top"] = sorted(((v[0] / steps, v[1] / steps, n) for n, v in per_op.items()), reverse=True)[:top]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--variants", default="eager,compiled,int8")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--top", type=int, default=0, help="also list the N operators with the most self time")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in args.presets.split(","):
        base = C.build_ours(name, torch.device("cpu"), **LIKE_FOR_LIKE).eval()
        for variant in args.variants.split(","):
            model = base
            if variant == "int8":
                from vqa.decoding.precision import quantize_int8

                model = copy.deepcopy(base).eval()
                quantize_int8(model)
            for b in (int(x) for x in args.batches.split(",")):
                r = profile_steps(model, b, variant, args.steps, args.top)
                rows.append((name, b, variant, r))
                print(f"[{name} b{b} {variant}] {r['wall_us']:.0f} us/step", file=sys.stderr)
    print(f"\n{C.environment(torch.device('cpu'))}; µs per decode step (median wall time without the profiler, "
          "split in the profiled proportions)\n")
    print(C.table(["preset", "batch", "step", "µs / step", "ops / step", *KINDS],
                  [[n, b, v, f"{r['wall_us']:.0f}", f"{r['ops_per_step']:.0f}", *(f"{r[k]:.0f}" for k in KINDS)]
                   for n, b, v, r in rows]))
    if args.top:
        for n, b, v, r in rows:
            print(f"\n{n}, batch {b}, {v}: the {args.top} operators with the most self time (µs / step, calls / step)")
            for us, calls, op in r["top"]:
                print(f"  {us:8.1f}  {calls:5.1f}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
