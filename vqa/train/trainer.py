"""The trainer: builds the tokenizer, model, data and optimizer from a TrainConfig, then runs the loop.

    from vqa.config import TrainConfig
    from vqa.train import train
    train(TrainConfig(data="data/shapes", out="runs/tiny", max_steps=500).with_preset_defaults())

A step is `accum` micro-batches of `batch_size` images per device (each image brings up to
`questions_per_image` questions and `captions_per_image` captions). The loss is the mean over every target
token of the global batch (caption tokens weighted by `caption_weight`), so N devices x B images trains
exactly like 1 device x N*B images. The step waits for the device once per logged step (to read the loss),
never otherwise: target counts come from the collate function, and the step's scalars (loss, target count,
the time-limit proposals of every rank: `vqa.train.budget.SharedBudget`) travel in one all-reduce.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import distributed
from ..config import TrainConfig, parse_duration
from ..data.collate import ImageTextBatch, make_collate
from ..data.ids import check_ids
from ..data.loader import TrainingMicroBatches
from ..data.regions import Regions
from ..data.sources import open_split, resolve_splits
from ..data.stream import Layout
from ..data.transforms import ImageNormalizer, build_transform
from ..device import autocast_dtype, use_tensor_cores
from ..errors import ConfigError, DataError, VQAError
from ..evaluation.evaluate import evaluate, flatten
from ..locks import RunLock
from ..logs import bars_off, get_logger
from ..weights import checkpoint
from . import build, sharding
from . import state as run_state
from .budget import SharedBudget, TimeDecision, evaluation_due
from .build import (
    check_flips,
    check_model_options,
    default_workers,
    init_from,
    init_from_shipped,
    new_model,
    new_tokenizer,
    shipped_towers,
)
from .new_words import add_new_words
from .optim import lr_factor, make_optimizer, set_lr
from .report import Reporter, plot_curves, read_metrics, trim_metrics
from .runfolder import SAVED, write_repeat_command
from .step import StepRunner, StepStats, wrap_ddp

log = get_logger("train")


class Trainer:
    def __init__(self, cfg: TrainConfig, dist: distributed.Dist | None = None):
        if cfg.lr is None or cfg.optimizer is None:
            cfg = cfg.with_preset_defaults()
        self.cfg, self.dist = cfg, dist or distributed.Dist()
        self.out = Path(cfg.out)
        self.lock = None
        try:
            check_model_options(cfg)  # every rank, before anything is written
            check_flips(cfg)
            distributed.on_main(self.dist, self._prepare_out)
            # official split names work without flags: train2014 / val2014, train2017 / val2017, ...
            self.train_split, self.val_split = resolve_splits(cfg.data, cfg.train_split, cfg.val_split)
            self.train_data = open_split(cfg.data, self.train_split)
            self.val_data = open_split(cfg.data, self.val_split) if self.val_split else None
            check_ids(self.val_data, cfg.tasks, cfg.eval_images)  # a repeated id stops here, not at the first eval
            if self.val_data is None and self.dist.main:
                log.info(f"vqa train: no validation split in {cfg.data}; training without evaluation")
            state = self._build_model()
            self._build_data()
            self._build_optim(state)
        except BaseException:
            self.close()  # the run folder is free again
            raise

    # ---- the run folder, model, tokenizer, data, optimizer ----
    def _prepare_out(self) -> None:
        """On rank 0 (`distributed.on_main`): the folder, its lock, the recovery of interrupted writes. Every rank
        waits for it and leaves with rank 0's error when it fails (a held lock, an existing run, an unwritable
        folder)."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            probe = self.out / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"cannot write to the output folder {self.out}: {e.strerror}") from e
        self.lock = RunLock(self.out).acquire()  # before anything in the folder is touched
        if ((self.out / "last").exists() or (self.out / "last.old").exists()) and not self.cfg.resume:
            raise ConfigError(f"{self.out} already holds a run; pass --resume to continue it or choose another --out")
        for name in ("last", "best"):
            checkpoint.recover(self.out / name)
        self.cfg.save(self.out / SAVED)

    def _build_model(self) -> dict | None:
        c = self.cfg
        last = self.out / "last"
        state = None
        if c.resume and (last / "train_state.pt").is_file():
            model, self.tok, self.card = checkpoint.load(last, merge_adapters=False)
            state = checkpoint.load_train_state(last)
        elif c.init_from:
            model, self.tok, self.card = init_from(c, c.init_from)
            if self.dist.main:
                log.info(f"vqa train: starting from the weights of {c.init_from} (a new run: step 0, a new optimizer)")
        elif shipped_towers(c):
            model, self.tok, self.card = init_from_shipped(c)
            if self.dist.main:
                log.info(f"vqa train: starting from the {c.preset} preset's pretrained towers "
                         f"({self.card['init_from']['weights']}; --from-scratch for random weights)")
        else:
            if c.resume and self.dist.main:
                log.info(f"vqa train: nothing to resume in {self.out}; starting a new run")
            self.tok = new_tokenizer(c, self.train_data, self.dist)
            model = new_model(c, self.tok)
            self.card = {}
        if state is None:  # a new run: --new-words grows a pretrained tokenizer and its embedding
            model, self.tok = add_new_words(c, model, self.tok, self.train_data, self.dist, self.card)
        data = c.data if "://" in c.data or c.data.startswith("pipe:") else str(Path(c.data).resolve())
        self.card.update(preset=c.preset, data=data, train_split=self.train_split,
                         tasks=list(c.tasks))
        torch.manual_seed(c.seed * 1_000_003 + self.dist.rank)  # dropout: each rank its own masks
        self.model = model.to(self.dist.device).train()
        build.memory_options(c, self.model)  # --lora-rank, --grad-checkpointing
        return state

    def _build_data(self) -> None:
        c, dist = self.cfg, self.dist
        self.workers = c.workers if c.workers >= 0 else default_workers(dist.device)
        self.batch_size = c.batch_size or build.default_batch(
            self.model, dist.device, checkpointing=c.grad_checkpointing, shards=build.shards_of(c, dist.world))
        if dist.main and (line := build.memory_line(
                self.model, self.batch_size, dist.device, c, dist.world)):  # a GPU's fit
            log.info("vqa train: " + line)
        # rows packed across images (vqa.data.packing), each target weighted by its task; compiled: lengths and
        # target counts padded to multiples of 8, so an epoch sees few shapes
        self.compiled = c.compile if c.compile is not None else dist.device.type == "cuda"  # where it pays
        regions = Regions.for_training(self.train_data, self.train_split, self.tok, self.model.cfg, c.grounding_weight,
                                       say=log.info if dist.main else None)
        weights = {"vqa": 1.0, "caption": c.caption_weight, **({"grounding": c.grounding_weight} if regions else {})}
        self.collate = make_collate(self.tok.pad_id, pad_multiple=8 if self.compiled else 1, task_weights=weights)
        self.data = TrainingMicroBatches(
            self.train_data, self.tok, build_transform(self.model.cfg, train=True, allow_hflip=c.hflip),
            self.model.cfg.dec_max_len, tasks=c.tasks, questions_per_image=c.questions_per_image,
            captions_per_image=c.captions_per_image, seed=c.seed,
            layout=Layout(dist.rank, dist.world, self.workers, self.batch_size, c.accum),
            pin=dist.device.type == "cuda", quiet=not dist.main, max_unreadable=c.max_unreadable,
            image_cache=c.image_cache, image_cache_budget=c.image_cache_budget, collate=self.collate,
            regions=regions,
        )
        self.normalize = ImageNormalizer(self.model.cfg.vit_mean, self.model.cfg.vit_std)  # on the device
        if self.data.num_images == 0:
            raise DataError(f"split '{self.train_split}' of {c.data} has no images for the tasks {', '.join(c.tasks)}")
        self.images_per_step = self.batch_size * c.accum * dist.world
        self.steps_per_epoch = self.data.steps_per_epoch
        if self.steps_per_epoch == 0:
            raise ConfigError(f"{self.data.num_images} training images cannot fill one step of {self.batch_size} x "
                              f"{c.accum} x {dist.world} images" + (f" x {max(1, self.workers)} loader workers (each "
                              "reads its own part of the shards)" if self.data.sampler is None else "")
                              + ": lower --batch-size or --accum")

    def _build_optim(self, state: dict | None) -> None:
        c, dist = self.cfg, self.dist
        self.sharded = c.shard == "fsdp" and dist.world > 1  # one process: nothing to shard
        if self.sharded:  # before the optimizer: the parameters become DTensors
            sharding.shard(self.model)
        vit_lr = 0.0 if self.model.cfg.vit_freeze else c.encoder_lr
        self.optimizer = make_optimizer(self.model, c.lr, vit_lr, c.weight_decay, kind=c.optimizer,
                                        dec_lr=c.decoder_lr, frozen=c.frozen_parts,
                                        fused=dist.device.type == "cuda", muon_scale=c.muon_lr_scale)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.amp_dtype = autocast_dtype(c.precision, dist.device)
        use_tensor_cores(dist.device)
        self.scaler = torch.amp.GradScaler(dist.device.type, enabled=self.amp_dtype == torch.float16)
        self.step, self.epoch, self.image_in_epoch, self.best, self.time_used = 0, 0, 0, -math.inf, 0.0
        self.total_steps = self._planned_steps()
        if state is not None:
            self._restore(state)
        # the model itself (its forward is the loss), wrapped as training asks: DDP (or FSDP, above), compiled
        ddp = dist.world > 1 and not self.sharded
        self.ddp = wrap_ddp(self.model, dist.device, dist.local_rank) if ddp else None
        self.fwd = self.ddp or self.model
        if self.compiled:
            self.fwd = torch.compile(self.fwd)
        self.runner = StepRunner(self.fwd, self.optimizer, self.scaler, self.params, dist.device, c.grad_clip,
                                 self.amp_dtype, dist.world, self.ddp, normalize=self.normalize)

    def _restore(self, state: dict) -> None:
        c, dist = self.cfg, self.dist
        run_state.restore_optimizer(self.optimizer, state, c.optimizer, self.out,
                                    self.model if self.sharded else None)
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.best = int(state["step"]), float(state["best"])
        self.epoch, self.image_in_epoch = run_state.data_position(state, self.images_per_step)
        self.time_used = float(state.get("time_used", 0.0))
        if self.total_steps is None:  # a time-limited run keeps its last plan until it refits
            self.total_steps = state.get("total_steps")
        warning = run_state.restore_rng(state, dist)
        if warning and dist.main:
            log.warning(f"vqa train: {warning}")

    def _planned_steps(self) -> int | None:
        c = self.cfg
        if c.max_steps:
            return c.max_steps
        if c.epochs:
            return max(1, int(c.epochs * self.steps_per_epoch))
        if c.time_limit:
            return None  # fitted to the measured speed after the first steps
        return 10 * self.steps_per_epoch

    def close(self) -> None:
        """Release the run folder (the lock) and the loader's workers; `train()` does it at the end."""
        if getattr(self, "data", None) is not None:
            self.data.close()
        if getattr(self, "report", None) is not None:
            self.report.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        # the DDP wrapper's reducer goes before the process group it talks through (gloo aborts a rank at exit)
        self.ddp = self.fwd = self.runner = None

    # ---- the loop ----
    def batches(self):
        """Yield each step's micro-batches from the saved data position on, forever."""
        c = self.cfg
        while True:
            micro: list[ImageTextBatch] = []
            for batch in self.data.epoch(self.epoch, self.image_in_epoch):
                micro.append(batch)
                if len(micro) == c.accum:
                    self.image_in_epoch += self.images_per_step  # counted first: a save right after records it
                    yield micro
                    micro = []
            self.epoch, self.image_in_epoch = self.epoch + 1, 0

    def train_step(self, micro: list[ImageTextBatch], extra: tuple[float, ...] = ()) -> torch.Tensor:
        """One optimizer step (`vqa.train.step.StepRunner`): returns, without waiting for the device, the
        tensor [summed loss, weighted target count, *extra] summed over ranks."""
        return self.runner(micro, extra)

    def fit(self, halt_at_step: int | None = None) -> int:
        """Train to the planned end; `halt_at_step` stops early after that step's checkpoint (as if killed)."""
        c, dist = self.cfg, self.dist
        budget = SharedBudget(parse_duration(c.time_limit), self.time_used, dist.world) if c.time_limit else None
        start = time.time() - self.time_used
        metrics = self.out / "metrics.jsonl"
        bar = self._start_reports(metrics)
        seen, t_log = 0, time.time()
        # evaluations (--eval-every 0): at each quarter of the planned steps, or of a --time-limit's time (the
        # planned steps of a time-limited run move as it is refitted); a resumed run goes on from its quarter
        evaluated_q = budget.quarter if budget is not None else 0
        for micro in self.batches():
            if self.total_steps is not None and self.step >= self.total_steps:
                break
            set_lr(self.optimizer, lr_factor(self.step, self._warmup(), self.total_steps or 10**9, schedule=c.schedule))
            logged = (self.step + 1) % c.log_every == 0 or self.step == 0
            t0 = time.time()
            summed = self.train_step(micro, budget.propose(self.step, logged) if budget is not None else ())
            self.step += 1
            seen += self.images_per_step
            if budget is not None:
                budget.record(time.time() - t0)
            stats = StepStats.read(summed) if logged else None  # the one host sync, at logged steps only
            if stats is not None and not math.isfinite(stats.loss_sum):
                raise VQAError(f"loss is {stats.loss} at step {self.step}: training stopped "
                               "(try a lower --lr, or --precision fp32)")
            decision = TimeDecision(quarter=evaluated_q)
            if budget is not None:
                decision = budget.agree(stats.extra if stats is not None else None)
            if decision.plan:
                self.total_steps = decision.plan
                if bar is not None:
                    bar.total = self.total_steps
            if stats is not None:
                self._log_step(stats, seen / (time.time() - t_log), time.time() - start, bar)
                seen, t_log = 0, time.time()
            if bar is not None:
                bar.update(1)
            finished = decision.out_of_time or (self.total_steps is not None and self.step >= self.total_steps)
            due = evaluation_due(self.step, c.eval_every, self.total_steps,
                                 None if budget is None else decision.quarter, evaluated_q)
            evaluated_q = max(decision.quarter, evaluated_q)
            if stats is not None or finished or due or self.step == halt_at_step:  # every rank at this step
                self.data.agree_unreadable(dist.device)  # --max-unreadable over all the ranks' pictures
            if finished or due or self.step == halt_at_step:
                self.time_used = time.time() - start
                self._evaluate_and_save(metrics)
            if finished or self.step == halt_at_step:
                break
        if bar is not None:
            bar.close()
        if dist.main:
            log.info(f"vqa train: {self.step} steps in {time.time() - start:.0f} s; checkpoints in {self.out}")
            if c.time_limit and self.step != halt_at_step:  # the steps it allowed, and the command repeating them
                log.info("vqa train: "
                         + write_repeat_command(c, self.out, self.step, self.images_per_step).rstrip("\n"))
        return 0

    def _start_reports(self, metrics: Path) -> tqdm | None:
        """The metrics log (trimmed to the last checkpoint on resume), the start-up line and, on rank 0, the
        progress bar."""
        dist = self.dist
        if dist.main:
            trim_metrics(metrics, self.step)
            log.info(f"vqa train: {self.model.num_parameters() / 1e6:.2f} M parameters, {self.data.num_images} images, "
                     f"{self.steps_per_epoch} steps/epoch, device {dist.device} x {dist.world}"
                     + (", sharded (FSDP)" if self.sharded else ""))
        self.report = Reporter(metrics, self.cfg.report_to, dist.main)
        if not dist.main:
            return None
        return tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True, file=sys.stderr,
                    disable=bars_off())

    def _log_step(self, stats: StepStats, images_per_s: float, seconds: float, bar: tqdm | None) -> None:
        """A logged step's line in metrics.jsonl (and --report-to) and the bar."""
        rec = dict(step=self.step, epoch=self.epoch, loss=round(stats.loss, 6), lr=self.optimizer.param_groups[0]["lr"],
                   images_per_s=round(images_per_s, 1), time=round(seconds, 1))
        self.report.log(rec, self.optimizer.param_groups)
        if bar is not None:
            bar.set_postfix(loss=f"{stats.loss:.3f}", lr=f"{rec['lr']:.2e}", img_s=f"{images_per_s:.0f}")

    def _warmup(self) -> int:
        """--warmup, unless it is as long as the run: then a tenth of the run (said once), so that the run
        reaches its peak learning rate and decays instead of warming up to its last step."""
        c, total = self.cfg, self.total_steps
        if total is None or c.warmup < total:
            return c.warmup
        short = max(1, total // 10)
        if not getattr(self, "_warned_warmup", False) and self.dist.main:
            log.info(f"vqa train: --warmup {c.warmup} is not shorter than the run's {total} steps; warming up over "
                     f"{short} instead")
        self._warned_warmup = True
        return short

    def _evaluate_and_save(self, metrics: Path) -> None:
        dist = self.dist
        scores, result = {}, {}
        evaluating = self.val_data is not None and self.cfg.eval_images > 0
        # sharded: a full copy evaluates (every rank: decoding lengths differ, gathers would not meet) and saves
        model = sharding.plain_copy(self.model, evaluating) if self.sharded else self.model
        if evaluating:  # every rank decodes its share; rank 0 scores
            model.eval()
            result = evaluate(model, self.tok, self.val_data, tasks=self.cfg.tasks, device=dist.device,
                              max_images=self.cfg.eval_images, progress=False, rank=dist.rank,
                              world=dist.world, amp_dtype=self.amp_dtype, workers=self.workers,
                              max_unreadable=self.cfg.max_unreadable, need_caption_scores=False)
            scores = result["summary"]
            self.model.train()
        if scores and dist.main:
            rec = dict(step=self.step, epoch=self.epoch, **{f"val_{k}": v for k, v in flatten(scores).items()})
            self.report.log(rec)
            self.report.pictures(self.step, result.get("caption_results", []), self.val_data)
            shown = [f"{k} {v:.4g}" for k, v in rec.items() if k in ("val_vqa_accuracy", "val_CIDEr-D", "val_BLEU-4")]
            if shown:  # decoded greedily, for speed: `vqa eval` scores the beam search that is served
                log.info(f"vqa train: step {self.step}: " + ", ".join(shown) + " (greedy decoding)")
        rng = run_state.rng_state(dist)
        optimizer = (sharding.full_optimizer_state(self.model, self.optimizer) if self.sharded
                     else self.optimizer.state_dict() if dist.main else None)
        if not dist.main:
            dist.barrier()
            return
        metric = scores.get("vqa_accuracy", scores.get("CIDEr-D"))
        card = dict(self.card, step=self.step, val_split=self.val_split, val_scores=scores,
                    parameters=self.model.num_parameters())
        state = dict(optimizer=optimizer, optimizer_kind=self.cfg.optimizer,
                     scaler=self.scaler.state_dict(), step=self.step, epoch=self.epoch,
                     image_in_epoch=self.image_in_epoch, best=self.best, total_steps=self.total_steps,
                     time_used=self.time_used, **rng)
        if metric is None or metric > self.best:
            if metric is not None:
                self.best = state["best"] = metric
            checkpoint.save(self.out / "best", model, self.tok, card)
        checkpoint.save(self.out / "last", model, self.tok, card, train_state=state)
        try:
            plot_curves(metrics, self.out / "curves.png")
        except Exception as e:  # a plot is never worth a run
            log.warning(f"vqa train: could not draw curves.png ({type(e).__name__}: {e})")
        dist.barrier()


__all__ = ["Trainer", "read_metrics"]
