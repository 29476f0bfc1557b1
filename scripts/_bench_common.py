"""Helpers shared by scripts/bench.py and scripts/bench_peer.py: synthetic VQA-shaped batches, our training
step, timing, peak memory, and table printing. Nothing here is part of the `vqa` package."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vqa.config import preset  # noqa: E402
from vqa.device import pick_device  # noqa: E402,F401 (the scripts' device choice is the package's)
from vqa.model import VQAModel  # noqa: E402
from vqa.train.optim import make_optimizer  # noqa: E402

VOCAB = 1000  # a VQA-sized BPE vocabulary
QUESTIONS = 4  # questions per image in a training batch
PROMPT = 12  # prompt tokens (<bos> + question) in training and generation
NEW_TOKENS = 16  # generated tokens per prompt
PAD, BOS, EOS = 0, 1, 2


# dense bf16 peak FLOP/s (no sparsity) by a substring of torch.cuda.get_device_name()
PEAK_BF16 = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("A100", 312e12),
             ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12),
             ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("V100", 125e12), ("T4", 65e12)]


def peak_bf16(device) -> tuple[float | None, str]:
    """(the CUDA device's dense bf16 peak FLOP/s or None if unknown, its name)."""
    name = torch.cuda.get_device_name(device)
    return next((f for key, f in PEAK_BF16 if key in name), None), name


def preset_image_size(name: str) -> int:
    return preset(name).vit_image_size


def build_ours(name: str, device, **overrides) -> VQAModel:
    """The preset's model with random weights (the same shapes as its pretrained towers: what is timed and
    measured does not depend on the weights, and nothing is downloaded)."""
    torch.manual_seed(0)
    random = {"vit_pretrained": False, "dec_pretrained": None, **overrides}
    return VQAModel(preset(name, vocab_size=VOCAB, **random)).to(device)


def vqa_batch(cfg, n_images: int, device, seed: int = 0) -> dict:
    """A training batch shaped like VQA: `n_images` images, QUESTIONS questions each of 10-14 prompt tokens
    (<bos> + question) and a 2-3 token answer + <eos>, right-padded; `image_index` maps each row to its image."""
    g = torch.Generator().manual_seed(seed)
    rows, targets = [], []
    for _ in range(n_images * QUESTIONS):
        p = int(torch.randint(PROMPT - 2, PROMPT + 3, (1,), generator=g))
        a = int(torch.randint(2, 4, (1,), generator=g))
        toks = torch.randint(3, VOCAB, (p - 1 + a,), generator=g).tolist()
        rows.append([BOS] + toks + [EOS])
        targets.append((p, p + a + 1))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (r, (s, e)) in enumerate(zip(rows, targets, strict=True)):
        ids[i, : len(r)] = torch.as_tensor(r)
        loss_mask[i, s:e] = True
    s = cfg.vit_image_size
    images = torch.randn(n_images, 3, s, s, generator=g)
    index = torch.arange(n_images).repeat_interleave(QUESTIONS)
    return {k: v.to(device) for k, v in
            dict(images=images, input_ids=ids, loss_mask=loss_mask, image_index=index).items()}


LENGTHS = ("fixed", "vqa2")  # train_items' length distributions


def train_items(cfg, n_images: int, seed: int = 0, captions: int = 1, lengths: str = "fixed") -> list[dict]:
    """Dataset items as vqa.data.dataset gives them. "fixed": an image with QUESTIONS VQA rows (10-14 prompt
    tokens, a 2-3 token answer + <eos>) and `captions` caption rows (<bos> <caption> + 8-14 tokens + <eos>).
    "vqa2": VQA v2-like, varying: 3 + Poisson(2.36) questions per image (mean 5.36, VQA v2 train's 443,757 / 82,783;
    at most 12), each <bos> <question> + 4 + Poisson(4.5) question tokens + <answer> (prompt ~11.5 tokens), a
    1-3 token answer (mostly 1) + <eos>: ~13.8 tokens a row; `captions` COCO-like caption rows of <bos>
    <caption> + 8 + Poisson(4) tokens + <eos> (~15 tokens)."""
    if lengths not in LENGTHS:
        raise ValueError(f"lengths {lengths!r}: choose one of {', '.join(LENGTHS)}")
    g = torch.Generator().manual_seed(seed)
    s = cfg.vit_image_size
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    poisson = lambda mean: int(torch.poisson(torch.tensor([float(mean)]), generator=g))  # noqa: E731
    items = []
    for _ in range(n_images):
        rows = []
        for _ in range(min(12, 3 + poisson(2.36)) if lengths == "vqa2" else QUESTIONS):
            # q tokens after <bos> in the prompt, a answer tokens before <eos> (drawn in this order: "fixed" draws
            # what it always drew)
            if lengths == "vqa2":
                q, a = 6 + poisson(4.5), 1 + (rand(0, 9) < 3) + (rand(0, 9) < 1)  # <question> ... <answer>
            else:
                q, a = rand(PROMPT - 2, PROMPT + 2) - 1, rand(2, 3)
            p = q + 1
            ids = [BOS] + torch.randint(3, VOCAB, (q + a,), generator=g).tolist() + [EOS]
            rows.append(dict(input_ids=ids, loss_mask=[False] * p + [True] * (a + 1), task="vqa", meta={},
                             prompt_len=p))
        for _ in range(captions):
            c = 8 + poisson(4) if lengths == "vqa2" else rand(8, 14)
            ids = [BOS, 4] + torch.randint(7, VOCAB, (c,), generator=g).tolist() + [EOS]
            rows.append(dict(input_ids=ids, loss_mask=[False] * 2 + [True] * (c + 1), task="caption", meta={},
                             prompt_len=2))
        items.append(dict(image=torch.randn(3, s, s, generator=g), rows=rows))
    return items


def step_runner(model, preset_name: str, device, compile: bool = False):
    """`vqa train`'s own step (vqa.train.step.StepRunner) around `model`: the preset's optimizer (Muon + AdamW
    for tiny), the model's training loss (`model(images, rows)`, `VQAModel.forward`), bf16 autocast on GPUs
    with bf16 tensor cores, the sync-free gradient scaling, clip 1.0. Returns (runner, optimizer); batches
    come from `train_batch`."""
    from vqa.config import TrainConfig
    from vqa.device import autocast_dtype
    from vqa.train.optim import make_optimizer as make
    from vqa.train.step import StepRunner

    cfg = TrainConfig(data="-", out="-", preset=preset_name).with_preset_defaults()
    model.train()
    opt = make(model, cfg.lr, cfg.encoder_lr, cfg.weight_decay, fused=device.type == "cuda", kind=cfg.optimizer,
               muon_scale=cfg.muon_lr_scale)
    fwd = torch.compile(model) if compile else model
    amp = autocast_dtype("auto", device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    params = [p for g in opt.param_groups for p in g["params"]]
    runner = StepRunner(fwd, opt, scaler, params, device, cfg.grad_clip, amp)
    return runner, opt


def train_batch(items: list[dict], preset_name: str, compile: bool = False):
    """`vqa train`'s batch of these items: rows packed across images, each caption token weighted by the
    preset's --caption-weight, lengths padded to 8s when compiled."""
    from vqa.config import TrainConfig
    from vqa.data.collate import collate

    weight = TrainConfig(data="-", out="-", preset=preset_name).with_preset_defaults().caption_weight
    return collate(items, PAD, pad_multiple=8 if compile else 1, task_weights={"vqa": 1.0, "caption": weight})


def prompts(batch: int, seed: int = 1, length: int = PROMPT, vocab: int = VOCAB) -> list[list[int]]:
    """`batch` generation prompts of `length` tokens (<bos> + question), all the same length (no padding)."""
    g = torch.Generator().manual_seed(seed)
    return [[BOS] + torch.randint(3, vocab, (length - 1,), generator=g).tolist() for _ in range(batch)]


def amp_dtype(device) -> torch.dtype | None:
    return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None


def ours_trainer(model: VQAModel, device, compile: bool = False):
    """A closure running one training step as `vqa train` does: the batch's rows packed across images
    (vqa.data.packing.pack, done once per batch, as the loader's workers do it), the training loss (one image
    encoding for all its questions, loss on the answer tokens only), autocast on CUDA, grad clip 1.0, AdamW."""
    from vqa.data.packing import pack

    model.train()
    opt = make_optimizer(model, 1e-4, 1e-4, 0.05, fused=device.type == "cuda")
    fwd = torch.compile(model) if compile else model
    dt = amp_dtype(device)
    packed: dict[int, tuple] = {}

    def step(b):
        if id(b) not in packed:
            rows = pack(_items(b), PAD, {"vqa": 1.0})
            packed[id(b)] = (rows.to(device), rows.weighted_targets)
        rows, n = packed[id(b)]
        with torch.autocast(device.type, dtype=dt or torch.float32, enabled=dt is not None):
            loss = fwd(b["images"], rows) / n
        return update(model, opt, loss)

    return step


def _items(b: dict) -> list[dict]:
    """A `vqa_batch` as the dataset's items (each image's rows, unpadded)."""
    items = [dict(rows=[]) for _ in range(b["images"].shape[0])]
    for ids, mask, m in zip(b["input_ids"].tolist(), b["loss_mask"].tolist(), b["image_index"].tolist(), strict=True):
        n = sum(t != PAD for t in ids)
        items[m]["rows"].append(dict(input_ids=ids[:n], loss_mask=mask[:n], task="vqa"))
    return items


def update(model, opt, loss):
    """One optimizer update, the same for both sides of a comparison: backward, clip to 1.0, step, zero."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def write_json(path, device, repeats, **results) -> None:
    """The benchmark's rows with the environment they were measured in."""
    with open(path, "w") as fh:
        json.dump(dict(environment=environment(device), repeats=repeats, **results), fh, indent=2)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


# ---- peak memory ----
_libc = None


def _trim() -> None:
    """Give freed heap pages back to the OS, so RSS is the live memory and the next peak is measured from it."""
    global _libc
    with contextlib.suppress(OSError, AttributeError):
        _libc = _libc or ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)


def _status_kb(field: str) -> int:
    m = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(m.group(1)) * 1024 if m else 0


class PeakMemory:
    """Peak memory of the code inside `with`, above what was live when it started. CUDA:
    torch.cuda.max_memory_allocated - memory_allocated (tensor memory). CPU (Linux): the process's peak
    resident set (VmHWM, reset through /proc/self/clear_refs after malloc_trim) minus its RSS at the start:
    every allocation, tensors and Python objects alike."""

    def __init__(self, device):
        self.device, self.bytes = device, 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            _trim()
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self.base = _status_kb("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.base
        else:
            self.bytes = _status_kb("VmHWM") - self.base
        return False


def tensor_peak(fn, device) -> int:
    """Peak bytes of tensor memory that `fn` allocates above what was live when it started. CUDA: the caching
    allocator's max_memory_allocated; CPU: the allocation records of torch.profiler(profile_memory=True)
    summed in time order (exact, but the profiled run is slower: never time it)."""
    if device.type == "cuda":
        with PeakMemory(device) as m:
            fn()
        return m.bytes
    from torch.profiler import ProfilerActivity, profile

    sys.stderr.flush()
    saved = os.dup(2)  # the profiler's C++ side logs every start/stop on stderr: silence it meanwhile
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    records = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]")
    cur = peak = 0
    for _, n in records:
        cur += n
        peak = max(peak, cur)
    return peak



# ---- what the machine allows ----
def machine_limits(device) -> dict:
    """The machine's memory read bandwidth and matmul rate, measured here (best of 5 after a warm-up):
    bandwidth = bytes / time of summing a 256 MiB float32 tensor (larger than any L3 cache, so it streams from
    memory; 1 GiB on CUDA); GEMM rate = 2 n^3 / time of an n x n float32 matmul, n = 2048 (CUDA: bf16, n = 8192,
    the dtype generation runs in there)."""
    cuda = device.type == "cuda"
    x = torch.ones((2**30 if cuda else 2**28) // 4, device=device)
    n, dt = (8192, torch.bfloat16) if cuda else (2048, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)

    def best(fn):
        fn()
        return min(timed(fn, device) for _ in range(5))

    with torch.inference_mode():
        bandwidth = x.numel() * 4 / best(lambda: x.sum())
        gemm = 2 * n**3 / best(lambda: a @ b)
    return dict(bandwidth=bandwidth, gemm=gemm)


def generation_bound(model, device, batch: int, limits: dict, new_tokens: int = NEW_TOKENS,
                     prompt_len: int = PROMPT) -> dict:
    """The least time greedy generation of `new_tokens` tokens after `prompt_len`-token prompts, one image per
    prompt, can take on this machine: each phase (encoding the images with every layer's cross-attention
    keys/values, the prefill with the first token's logits, and each further step) takes at least its FLOPs at
    the measured GEMM rate and at least its bytes read at the measured bandwidth, whichever is longer. FLOPs
    are counted by torch.utils.flop_counter on the model itself; the bytes of a step are the decoder weights
    it reads (all but the cross-attention key/value projections, which run once per image) and, per row, the
    image's keys/values and the self-attention cache. At batch 1 this comes down to the ViT's
    FLOPs at the GEMM rate plus, per new token, the decoder's weights at the memory bandwidth."""
    from torch.utils.flop_counter import FlopCounterMode

    from vqa.config import GenerationConfig
    from vqa.decoding.batch import DecodingBatch

    cfg = model.cfg
    dtype = next(model.parameters()).dtype
    size = torch.finfo(dtype).bits // 8
    s = cfg.vit_image_size
    images = torch.randn(batch, 3, s, s, device=device, dtype=dtype)
    with torch.inference_mode():
        with FlopCounterMode(display=False) as fc:
            kv = model.memory_kv(model.encode(images))
        enc_flops = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc:
            dec = DecodingBatch(model, kv, prompts(batch, length=prompt_len, vocab=cfg.vocab_size),
                               GenerationConfig(max_new_tokens=new_tokens))
        pre_flops = fc.get_total_flops()
        tok = torch.full((batch,), 5, device=device)
        with FlopCounterMode(display=False) as fc:
            dec.step(tok)
        step_flops = fc.get_total_flops()
    cross_kv = {id(p) for blk in model.decoder.blocks for p in blk.cross_attn.kv.parameters()}
    weights = sum(p.numel() * size for p in model.decoder.parameters() if id(p) not in cross_kv)
    n, layers, d = kv[0][0].shape[2], cfg.dec_depth, cfg.dec_width
    per_row = layers * 2 * d * size * (n + prompt_len + new_tokens)  # image keys/values + self-attention cache
    vit_bytes = sum(p.numel() * size for p in model.vision.parameters())

    def phase(flops, nbytes):
        return max(flops / limits["gemm"], nbytes / limits["bandwidth"])

    enc = phase(enc_flops, vit_bytes)
    pre = phase(pre_flops, weights + batch * per_row)
    step = phase(step_flops, weights + batch * per_row)
    return dict(bound_ms=1e3 * (enc + pre + (new_tokens - 1) * step), encode_ms=1e3 * enc, prefill_ms=1e3 * pre,
                step_ms=1e3 * step, encode_gflop=enc_flops / 1e9, step_mb=(weights + batch * per_row) / 1e6)


def environment(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()} | torch {torch.__version__}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"CPU x{os.cpu_count()} ({torch.get_num_threads()} torch threads, load average {load:.1f}) | "
            f"torch {torch.__version__}")


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"
