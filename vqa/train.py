"""`vqa train`: the training loop, the same code on a laptop CPU and on many GPUs.

    vqa train --data data/shapes --out runs/tiny --preset tiny --time-limit 10m       # one device
    torchrun --nproc_per_node 8 -m vqa.cli train --data DIR --out RUN --preset base  # many GPUs (DDP)
    vqa train --data DIR --out RUN --resume                                          # continue exactly

A step is `--accum` micro-batches of `--batch-size` images per device (each image brings up to
`--questions-per-image` questions and `--captions-per-image` captions). The loss is the mean over every target
token of the global batch, so N devices x B images trains exactly like 1 device x N*B images.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from . import checkpoint, distributed
from .config import PRESETS, preset
from .data.dataset import ImageTextDataset, make_collate
from .data.formats import corpus_texts, find_splits, load_split
from .data.transforms import build_transform
from .errors import ConfigError, DataError, VQAError
from .evaluate import evaluate, flatten
from .model import VQAModel
from .optim import MUON_LR_SCALE, OPTIMIZERS, lr_factor, make_optimizer, set_lr
from .plots import plot_curves
from .tokenizer import Tokenizer

LR_DEFAULTS = {"tiny": 1e-3, "small": 3e-4, "base": 1e-4}
# the encoder's learning rate as a fraction of --lr when --vit-lr is not given: a from-scratch encoder that
# moves more slowly than the decoder lets the decoder's cross-attention settle sooner (docs/shapes-10min.md)
VIT_LR_SCALE = {"tiny": 0.3}
# Muon (hidden matrices) + AdamW (the rest) trains the from-scratch tiny preset much faster per step: 82.4% vs
# 71.2% Shapes val after ten 1-thread CPU minutes (docs/shapes-10min.md, section 5); the other presets, meant
# for pretrained encoders, keep AdamW (not measured with Muon)
OPTIMIZER_DEFAULTS = {"tiny": "muon"}


def add_arguments(p) -> None:
    p.add_argument("--data", required=True, help="data folder (VQA v2 / COCO / JSONL files; see data/README.md)")
    p.add_argument("--out", required=True, help="run folder: checkpoints best/ and last/, metrics.jsonl, curves.png")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a model config field")
    p.add_argument("--tasks", default="vqa,caption", help="vqa, caption or both (comma-separated)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, help="train this many passes over the images")
    length.add_argument("--max-steps", type=int, help="train this many optimizer steps")
    length.add_argument("--time-limit", help="train for this long (e.g. 10m, 90s, 1h); the cosine schedule is fitted to it")
    p.add_argument("--batch-size", type=int, default=32, help="images per device per micro-batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--questions-per-image", type=int, default=6, help="questions per image per step (Shapes has 6)")
    p.add_argument("--captions-per-image", type=int, default=1)
    p.add_argument("--caption-weight", type=float, default=0.5,
                   help="loss weight of a caption token relative to an answer token (default 0.5: a caption has "
                        "~10x an answer's tokens, and at 1.0 captions take most of the gradient; on Shapes 0.5 "
                        "beat 0.2 once the decoder could read positions, docs/shapes-10min.md section 5)")
    p.add_argument("--lr", type=float, help="peak learning rate (default by preset: " + str(LR_DEFAULTS) + ")")
    p.add_argument("--vit-lr", type=float, help="learning rate of the vision encoder (default: --lr, times "
                   + ", ".join(f"{v} for {k}" for k, v in VIT_LR_SCALE.items()) + "; 0 freezes it)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="adamw, or muon: Muon for the weights of linear layers "
                   f"(at {MUON_LR_SCALE:g} x the lr), AdamW for the rest (default by preset: {OPTIMIZER_DEFAULTS}, else adamw)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: four per run)")
    p.add_argument("--eval-images", type=int, default=300, help="val images scored by the evaluations during training (vqa eval scores them all)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--tokenizer", help="use this tokenizer.json instead of training one on the training text")
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary when training a tokenizer")
    p.add_argument("--init-from", help="start from this checkpoint's weights and tokenizer (fine-tuning)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=-1, help="data loader workers (-1: 0 on CPU, 4 on GPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-cache-images", action="store_true", help="decode images every step instead of keeping them in RAM")
    p.add_argument("--halt-at-step", type=int, help=__import__("argparse").SUPPRESS)  # tests: stop as if killed


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not m:
        raise ConfigError(f"--time-limit {text!r}: use a number with s, m or h (e.g. 10m)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def epoch_order(n: int, epoch: int, seed: int, rank: int, world: int) -> list[int]:
    """This rank's image order for an epoch: one seeded permutation, padded to a multiple of `world`, then
    dealt out rank::world (as DistributedSampler does), so the global batch is the same for any world size."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    perm += perm[: (-len(perm)) % world]
    return perm[rank::world]


def run(args) -> int:
    d = distributed.setup(args.device)
    try:
        return Trainer(args, d).fit()
    finally:
        distributed.cleanup()


class Trainer:
    def __init__(self, args, d: distributed.Dist):
        self.args, self.d = args, d
        self.out = Path(args.out)
        self.tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
        if not set(self.tasks) <= {"vqa", "caption"} or not self.tasks:
            raise ConfigError(f"--tasks {args.tasks!r}: choose vqa, caption or vqa,caption")
        self._check_writable()
        self.train_data = load_split(args.data, args.train_split)
        splits = find_splits(args.data)
        self.val_data = load_split(args.data, args.val_split) if args.val_split in splits else None
        if self.val_data is None and d.main:
            print(f"vqa train: no '{args.val_split}' split in {args.data}; training without evaluation", file=sys.stderr)
        state = self._build()
        self._build_data()
        self._build_optim(state)

    def _check_writable(self) -> None:
        if self.d.main:
            try:
                self.out.mkdir(parents=True, exist_ok=True)
                probe = self.out / ".write-test"
                probe.write_text("ok")
                probe.unlink()
            except OSError as e:
                raise ConfigError(f"cannot write to the output folder {self.out}: {e.strerror}") from e
            if ((self.out / "last").exists() or (self.out / "last.old").exists()) and not self.args.resume:
                raise ConfigError(f"{self.out} already holds a run; pass --resume to continue it or choose another --out")

    # ---- model, tokenizer, data, optimizer ----
    def _build(self) -> dict | None:
        a = self.args
        last = self.out / "last"
        for name in ("last", "best"):
            checkpoint.recover(self.out / name)
        state = None
        if a.resume and (last / "train_state.pt").is_file():
            model, self.tok, self.card = checkpoint.load(last)
            state = checkpoint.load_train_state(last)
        elif a.init_from:
            model, self.tok, self.card = checkpoint.load(a.init_from)
        else:
            if a.resume and self.d.main:
                print(f"vqa train: nothing to resume in {self.out}; starting a new run", file=sys.stderr)
            if a.tokenizer:
                self.tok = Tokenizer.load(a.tokenizer)
            else:
                self.tok = Tokenizer.train(corpus_texts(self.train_data), vocab_size=a.vocab_size)
            ids = dict(vocab_size=self.tok.vocab_size, pad_id=self.tok.pad_id, bos_id=self.tok.bos_id, eos_id=self.tok.eos_id)
            torch.manual_seed(a.seed)  # every rank builds the same initial weights
            model = VQAModel(preset(a.preset, **{**parse_overrides(a.set), **ids}))
            self.card = {}
        self.cfg = model.cfg
        self.card.update(preset=a.preset, data=str(Path(a.data).resolve()), train_split=a.train_split, tasks=list(self.tasks))
        self.model = model.to(self.d.device).train()
        return state

    def _build_data(self) -> None:
        a = self.args
        self.dataset = ImageTextDataset(
            self.train_data, self.tok, build_transform(self.cfg, train=True), self.cfg.dec_max_len, tasks=self.tasks,
            questions_per_image=a.questions_per_image, captions_per_image=a.captions_per_image, train=True,
            seed=a.seed, cache_images=not a.no_cache_images,
        )
        if len(self.dataset) == 0:
            raise DataError(f"split '{a.train_split}' of {a.data} has no images for the tasks {', '.join(self.tasks)}")
        per_step = a.batch_size * a.accum
        self.steps_per_epoch = len(epoch_order(len(self.dataset), 0, a.seed, self.d.rank, self.d.world)) // per_step
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"{len(self.dataset)} training images cannot fill one step of {per_step} x {self.d.world} images: "
                "lower --batch-size or --accum"
            )
        self.workers = a.workers if a.workers >= 0 else (0 if self.d.device.type == "cpu" else 4)
        self.collate = make_collate(self.tok.pad_id)

    def _build_optim(self, state: dict | None) -> None:
        a, d = self.args, self.d
        self.lr = a.lr if a.lr is not None else LR_DEFAULTS.get(a.preset, 3e-4)
        vit_lr = self.lr * VIT_LR_SCALE.get(a.preset, 1.0) if a.vit_lr is None else a.vit_lr
        if self.cfg.vit_freeze:
            vit_lr = 0.0
        self.optimizer_kind = a.optimizer or OPTIMIZER_DEFAULTS.get(a.preset, "adamw")
        self.optimizer = make_optimizer(self.model, self.lr, vit_lr, a.weight_decay, fused=d.device.type == "cuda",
                                        kind=self.optimizer_kind)
        prec = a.precision
        if prec == "auto":
            prec = "bf16" if d.device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec)
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=prec == "fp16")
        self.step, self.epoch, self.batch_in_epoch, self.best = 0, 0, 0, -math.inf
        self.total_steps = self._planned_steps()
        if state is not None:
            saved = state.get("optimizer_kind", "adamw")
            if saved != self.optimizer_kind:
                raise ConfigError(f"{self.out} was trained with --optimizer {saved}; resume it with the same, "
                                  f"not {self.optimizer_kind}")
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
            self.best, self.total_steps = state["best"], state["total_steps"]
            self.time_used = state.get("time_used", 0.0)
            random.setstate(state["python_rng"])
            torch.set_rng_state(state["torch_rng"])
            cuda_rng = state.get("cuda_rng")
            if d.device.type == "cuda" and cuda_rng is not None and len(cuda_rng) == d.world:
                torch.cuda.set_rng_state(cuda_rng[d.rank], d.device)  # this rank's own generator
        else:
            self.time_used = 0.0
        self.ddp = DDP(self.model, device_ids=[d.local_rank] if d.device.type == "cuda" else None) if d.world > 1 else None
        self.fwd = torch.compile(self.ddp or self.model) if a.compile else (self.ddp or self.model)

    def _planned_steps(self) -> int | None:
        a = self.args
        if a.max_steps:
            return a.max_steps
        if a.epochs:
            return max(1, int(a.epochs * self.steps_per_epoch))
        if a.time_limit:
            return None  # fitted to the measured speed after the first steps
        return 10 * self.steps_per_epoch

    # ---- the loop ----
    def batches(self):
        """Yield (epoch, batch_in_epoch, micro-batches) from the saved data position on, forever."""
        a = self.args
        per_step = a.batch_size * a.accum
        while True:
            self.dataset.set_epoch(self.epoch)
            order = epoch_order(len(self.dataset), self.epoch, a.seed, self.d.rank, self.d.world)
            order = order[self.batch_in_epoch * per_step : self.steps_per_epoch * per_step]
            # its own generator: a DataLoader draws its base seed from the global RNG otherwise, and a resumed
            # run (new loader mid-epoch) would shift every later dropout mask
            loader = DataLoader(self.dataset, batch_size=a.batch_size, sampler=order, collate_fn=self.collate,
                                num_workers=self.workers, pin_memory=self.d.device.type == "cuda",
                                generator=torch.Generator().manual_seed(a.seed * 1_000_003 + self.epoch))
            micro = []
            for batch in loader:
                micro.append(batch)
                if len(micro) == a.accum:
                    self.batch_in_epoch += 1  # counted before training on it, so a save right after records it
                    yield micro
                    micro = []
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def train_step(self, micro: list[dict]) -> tuple[float, int]:
        """One optimizer step over the micro-batches; returns (global mean loss, images in the global batch)."""
        dev, d = self.d.device, self.d
        weight = {"vqa": 1.0, "caption": self.args.caption_weight}
        groups = [split_by_task(b, dev) for b in micro]
        # the objective is the weighted mean over every target token of the global batch
        n_global = d.all_sum(sum(weight[t] * int(m[:, 1:].sum()) for g in groups for t, m in zip(g[3], g[1], strict=True)))
        loss_sum = 0.0
        for i, b in enumerate(micro):
            if self.ddp is not None:  # sync gradients on the last micro-batch only (as nanoGPT does)
                self.ddp.require_backward_grad_sync = i == len(micro) - 1
            ids, mask, index, tasks = groups[i]
            with torch.autocast(dev.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
                out = self.fwd(b["images"].to(dev, non_blocking=True), ids, loss_mask=mask, image_index=index,
                               return_logits=False, group_weights=[weight[t] for t in tasks])
            part = out.loss * out.n_targets  # this micro-batch's summed token loss
            loss_sum += float(part.detach())
            # DDP averages gradients over ranks, hence x world: the result is d(sum of all losses) / n_global
            self.scaler.scale(part * d.world / (n_global or 1.0)).backward()
        loss = d.all_sum(loss_sum) / (n_global or 1.0)
        if not math.isfinite(loss):
            raise VQAError(f"loss is {loss} at step {self.step + 1}: training stopped (try a lower --lr, or --precision fp32)")
        self.scaler.unscale_(self.optimizer)
        if self.args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, int(d.all_sum(sum(len(b["images"]) for b in micro)))

    def fit(self) -> int:
        a, d = self.args, self.d
        limit = parse_duration(a.time_limit) if a.time_limit else None
        metrics = self.out / "metrics.jsonl"
        if d.main:
            self._trim_metrics(metrics)
            print(f"vqa train: {self.model.num_parameters() / 1e6:.2f} M parameters, {len(self.dataset)} images, "
                  f"{self.steps_per_epoch} steps/epoch, device {d.device} x {d.world}", file=sys.stderr)
        bar = None
        if d.main:
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True, file=sys.stderr)
        start, seen, t_log, measured = time.time() - self.time_used, 0, time.time(), []
        fit_to_time = limit is not None and not (a.max_steps or a.epochs)
        for micro in self.batches():
            if self.total_steps is not None and self.step >= self.total_steps:
                break
            set_lr(self.optimizer, lr_factor(self.step, a.warmup, self.total_steps or 10**9))
            t0 = time.time()
            loss, n_img = self.train_step(micro)
            self.step += 1
            seen += n_img
            measured.append(time.time() - t0)
            if fit_to_time and (len(measured) == 20 or (len(measured) > 20 and self.step % 50 == 0)):
                # fit the schedule to the time limit: first from the median of 20 steps, then every 50 steps
                # from the mean since then, evaluations and data included (a run slows down after its first
                # steps: fitted once, a 10-minute run ended at 80% of its cosine)
                now = time.time()
                if len(measured) == 20:
                    per_step, share, fit_from = sorted(measured[1:])[len(measured) // 2], 0.9, (now, self.step)
                else:
                    per_step, share = (now - fit_from[0]) / (self.step - fit_from[1]), 0.98
                local = self.step + max(1, int(share * (limit - (now - start)) / per_step))
                self.total_steps = int(d.all_sum(local) // d.world)  # every rank must follow one schedule
                if bar is not None:
                    bar.total = self.total_steps
            rec = None
            if self.step % a.log_every == 0 or self.step == 1:
                ips = seen / (time.time() - t_log)
                rec = dict(step=self.step, epoch=self.epoch, loss=round(loss, 6), lr=self.optimizer.param_groups[0]["lr"],
                           images_per_s=round(ips, 1), time=round(time.time() - start, 1))
                seen, t_log = 0, time.time()
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{rec['lr']:.2e}", img_s=f"{ips:.0f}")
            if d.main and rec is not None:
                with open(metrics, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            if bar is not None:
                bar.update(1)
            # decided together: a rank that stopped alone would leave the others waiting in an all-reduce
            out_of_time = limit is not None and d.all_sum(time.time() - start >= limit) > 0
            finished = out_of_time or (self.total_steps is not None and self.step >= self.total_steps)
            every = a.eval_every or max(1, (self.total_steps or 10**9) // 4)
            if finished or self.step % every == 0 or self.step == a.halt_at_step:
                self.time_used = time.time() - start
                self._evaluate_and_save(metrics)
            if finished or self.step == a.halt_at_step:
                break
        if bar is not None:
            bar.close()
        if d.main:
            print(f"vqa train: {self.step} steps in {time.time() - start:.0f} s; checkpoints in {self.out}", file=sys.stderr)
        return 0

    def _trim_metrics(self, metrics: Path) -> None:
        """On resume, drop what a killed run logged after its last checkpoint, so the curve has no repeats."""
        if metrics.exists():
            keep = [line for line in metrics.read_text().splitlines() if line and json.loads(line).get("step", 0) <= self.step]
            metrics.write_text("".join(line + "\n" for line in keep))

    def _evaluate_and_save(self, metrics: Path) -> None:
        d = self.d
        scores = {}
        if self.val_data is not None and d.main:
            self.model.eval()
            scores = evaluate(self.model, self.tok, self.val_data, tasks=self.tasks, device=d.device,
                              max_images=self.args.eval_images, progress=False)["summary"]
            self.model.train()
            rec = dict(step=self.step, epoch=self.epoch, **{f"val_{k}": v for k, v in flatten(scores).items()})
            with open(metrics, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"\nvqa train: step {self.step}: " + ", ".join(f"{k} {v}" for k, v in rec.items()
                  if k in ("val_vqa_accuracy", "val_CIDEr-D", "val_BLEU-4")), file=sys.stderr)
        cuda_rng = None
        if d.device.type == "cuda":  # every rank's own generator state, gathered on rank 0
            cuda_rng = [torch.cuda.get_rng_state(d.device)]
            if d.world > 1:
                cuda_rng = [None] * d.world
                torch.distributed.all_gather_object(cuda_rng, torch.cuda.get_rng_state(d.device))
        if not d.main:
            d.barrier()
            return
        metric = scores.get("vqa_accuracy", scores.get("CIDEr-D"))
        card = dict(self.card, step=self.step, val_split=self.args.val_split, val_scores=scores,
                    parameters=self.model.num_parameters())
        state = dict(optimizer=self.optimizer.state_dict(), optimizer_kind=self.optimizer_kind,
                     scaler=self.scaler.state_dict(), step=self.step, epoch=self.epoch,
                     batch_in_epoch=self.batch_in_epoch, best=self.best, total_steps=self.total_steps,
                     time_used=self.time_used, python_rng=random.getstate(), torch_rng=torch.get_rng_state(),
                     cuda_rng=cuda_rng)
        if metric is not None and metric > self.best:
            self.best = state["best"] = metric
            checkpoint.save(self.out / "best", self.model, self.tok, card)
        elif metric is None:
            checkpoint.save(self.out / "best", self.model, self.tok, card)
        checkpoint.save(self.out / "last", self.model, self.tok, card, train_state=state)
        with contextlib.suppress(Exception):
            plot_curves(metrics, self.out / "curves.png")
        d.barrier()


def split_by_task(batch: dict, device) -> tuple[list, list, list, list]:
    """The batch's rows grouped by task, each group cut to its own longest row: VQA rows are short, caption
    rows long, and padding them to one length would double the decoder's work."""
    ids, mask, index = [], [], []
    tasks = batch["task"]
    for task in dict.fromkeys(tasks):
        rows = torch.tensor([i for i, t in enumerate(tasks) if t == task])
        width = int(batch["attention_mask"][rows].sum(1).max())
        ids.append(batch["input_ids"][rows, :width].to(device, non_blocking=True))
        mask.append(batch["loss_mask"][rows, :width].to(device, non_blocking=True))
        index.append(batch["image_index"][rows].to(device, non_blocking=True))
    return ids, mask, index, list(dict.fromkeys(tasks))
