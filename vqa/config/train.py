"""`TrainConfig`: everything `vqa train` takes (the command line is generated from it, see `vqa.options`);
a run folder keeps the resolved one as `train_config.json`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .base import _Config, _opt, check_fields, number_problem, scalar_type, type_problem
from .model import ModelConfig, check_field
from .presets import PRESETS, get_preset, preset_fields

# the parts of the model that train with their own learning rate, or not at all (vqa.train.optim.part_of)
PARTS = ("cross_attention", "decoder", "encoder")


def _names(value: Any, allowed: tuple[str, ...], flag: str, hint: str | None = None) -> tuple[str, ...]:
    """'a, b' / ['a'] -> the distinct names, each one of `allowed` (ConfigError naming `flag` and `hint`)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(str(p).strip() for p in items if str(p).strip()))
    if not names or any(n not in allowed for n in names):
        hint = hint or f"name one or more of {', '.join(allowed)} (comma-separated)"
        raise ConfigError(f"{flag} {value!r}: {hint}")
    return names


# what --lora-targets names: the language model's self-attention and MLP projections, the ViT's linear layers
LORA_TARGETS = ("self_attn", "mlp", "vit")


def parse_targets(value: Any) -> tuple[str, ...]:
    return _names(value, LORA_TARGETS, "--lora-targets")


def parse_tasks(value: Any) -> tuple[str, ...]:
    """'vqa, caption' / ['vqa'] -> a tuple of known task names (ConfigError otherwise)."""
    return _names(value, ("vqa", "caption"), "tasks", "choose vqa, caption or vqa,caption")


# how torchrun's processes hold the model (vqa.train.sharding for fsdp)
SHARDS = ("ddp", "fsdp")

LENGTH_FIELDS = ("epochs", "max_steps", "time_limit")

# the numeric options' ranges: field -> (the lowest value, whether a value must be above it rather than at
# least it). A rate of 0 freezes a part (--vit-lr, --dec-lr), --lr 0 keeps every weight where it starts (the
# tests check an --init-from that way); --grad-clip 0 is no clipping, --eval-every 0 four evaluations per run,
# --eval-images 0 no evaluation, --workers -1 the default count
RANGES: dict[str, tuple[float, bool]] = {
    "lr": (0, False), "vit_lr": (0, False), "dec_lr": (0, False), "vit_lr_scale": (0, False),
    "dec_lr_scale": (0, False), "muon_lr_scale": (0, False), "weight_decay": (0, False), "caption_weight": (0, False),
    "grounding_weight": (0, False),
    "grad_clip": (0, False), "dist_timeout": (0, True), "epochs": (0, True),
    "max_steps": (1, False), "batch_size": (1, False), "accum": (1, False), "log_every": (1, False),
    "questions_per_image": (0, False), "captions_per_image": (0, False), "warmup": (0, False),
    "eval_every": (0, False), "eval_images": (0, False), "workers": (-1, False), "max_unreadable": (0, False),
    "lora_rank": (1, False), "lora_alpha": (0, True), "new_words": (0, False),
}
# the per-image counts a task needs (0 would leave the task untrained)
TASK_COUNTS = {"vqa": "questions_per_image", "caption": "captions_per_image"}


@dataclass
class TrainConfig(_Config):
    """Everything `vqa train` takes. `vqa train --help` is generated from these fields and their help."""

    data: str = field(default="", metadata=_opt(
        "data folder (VQA v2 / COCO / JSONL files, or split folders of webdataset / parquet shards), or a "
        "shard pattern (shards/{00000..00099}.tar, https://..., pipe:...); `vqa data info DIR` lists what it finds",
        metavar='DIR'))
    out: str = field(default="", metadata=_opt(
        "run folder: checkpoints best/ and last/, metrics.jsonl, curves.png", metavar='RUN'))
    preset: str = field(default="tiny", metadata=_opt("model and training defaults", choices=tuple(PRESETS)))
    model: dict = field(default_factory=dict, metadata=_opt(
        "override a model config field (repeatable); the fields, each with what it does: "
        "`python -c 'import vqa.config as c; help(c.ModelConfig)'`", flag="--set", metavar="FIELD=VALUE"))
    tasks: tuple = field(default=("vqa", "caption"), metadata=_opt("vqa, caption or both (comma-separated)"))
    epochs: float | None = field(default=None, metadata=_opt("train this many passes over the images"))
    max_steps: int | None = field(default=None, metadata=_opt("train this many optimizer steps"))
    time_limit: str | None = field(default=None, metadata=_opt(
        "train for this long (e.g. 10m, 90s, 1h); the cosine schedule is fitted to it", metavar='DURATION'))
    batch_size: int | None = field(default=None, metadata=_opt(
        "images per device per micro-batch (default: 32 on a CPU; on a GPU the most, up to 256, that the model's "
        "estimated training memory fits in 60% of the GPU's, a power of two)"))
    accum: int = field(default=1, metadata=_opt("micro-batches per optimizer step (gradient accumulation)"))
    questions_per_image: int = field(default=6, metadata=_opt("questions per image per step (Shapes has 6)"))
    captions_per_image: int = field(default=1, metadata=_opt("captions per image per step (tiny: 2)"))
    caption_weight: float = field(default=0.5, metadata=_opt(
        "loss weight of a caption token relative to an answer token (a caption has many more tokens than an answer)"))
    grounding_weight: float = field(default=0.0, metadata=_opt(
        "loss weight of a grounded token: on a Shapes or Scenes folder, whose scenes file has every object's box, "
        "the cross-attention behind a word that names an object (and behind a colour, shape or count answer) is "
        "trained to look at that object (docs/grounding.md); 0: off (tiny: 1)"))
    lr: float | None = field(default=None, metadata=_opt(
        "peak learning rate of the cross-attention layers; the decoder's and the encoder's default to "
        "fractions of it (default: the preset's; 0: every weight stays as it starts)"))
    vit_lr: float | None = field(default=None, metadata=_opt(
        "learning rate of the vision encoder (default: --lr x --vit-lr-scale; 0 freezes it)"))
    vit_lr_scale: float = field(default=1.0, metadata=_opt(
        "the encoder's lr as a fraction of --lr (tiny: 0.3, *-gpt2: 0.1)"))
    dec_lr: float | None = field(default=None, metadata=_opt(
        "learning rate of the text decoder's own layers, all but its cross-attention "
        "(default: --lr x --dec-lr-scale; 0 freezes them)"))
    dec_lr_scale: float = field(default=1.0, metadata=_opt("the decoder's lr as a fraction of --lr (*-gpt2: 0.2)"))
    train_only: tuple | None = field(default=None, metadata=_opt(
        "train only these parts and freeze the others: cross_attention (with the image projection), decoder, "
        "encoder (comma-separated)", metavar="PARTS"))
    optimizer: str | None = field(default=None, metadata=_opt(
        "adamw, or muon: Muon for the weights of linear layers, AdamW for the rest (default: the preset's)",
        choices=("adamw", "muon")))
    muon_lr_scale: float = field(default=10.0, metadata=_opt(
        "with --optimizer muon: Muon's lr = this x --lr. Its updates are RMS-matched to AdamW's, so the matrices "
        "it trains move ~this x as far per step as AdamW would move them, and their weight decay (lr x "
        "--weight-decay) is this x stronger"))
    weight_decay: float = field(default=0.05, metadata=_opt(
        "decoupled weight decay of matrices: each step multiplies them by 1 - lr x this (Muon's at its own lr)"))
    warmup: int = field(default=100, metadata=_opt("linear warmup steps"))
    schedule: str = field(default="cosine", metadata=_opt(
        "the learning rate after the warmup: cosine (down to a tenth of --lr at the end of the run) or noam "
        "(the Transformer paper's: --lr x sqrt(warmup / step), no end; docs/pretraining.md)",
        choices=("cosine", "noam")))
    grad_clip: float = field(default=1.0, metadata=_opt("clip the global gradient norm to this (0: off)"))
    eval_every: int = field(default=0, metadata=_opt(
        "steps between evaluations (0: four a run, at each quarter of the planned steps or of --time-limit)"))
    eval_images: int = field(default=300, metadata=_opt(
        "val images scored by the evaluations during training (0: no evaluation, the checkpoints are still "
        "saved; vqa eval scores them all)"))
    log_every: int = field(default=10, metadata=_opt("steps between log lines in metrics.jsonl"))
    train_split: str | None = field(default=None, metadata=_opt(
        "the split to train on (default: 'train', else the one split named train..., e.g. train2014)", metavar='SPLIT'))
    val_split: str | None = field(default=None, metadata=_opt(
        "the split evaluated during training (default: 'val', else the one named val..., e.g. val2014); "
        "with a shard pattern as --data, a shard pattern", metavar='SPLIT'))
    tokenizer: str | None = field(default=None, metadata=_opt(
        "use this tokenizer.json instead of training one on the training text", metavar='FILE'))
    vocab_size: int | None = field(default=None, metadata=_opt(
        "BPE tokens of the tokenizer trained on the training text (default 8000; the 256 byte tokens come beside "
        "them); refused where the tokenizer comes from elsewhere (--tokenizer, --init-from, a pretrained "
        "decoder, the tiny preset's towers)"))
    init_from: str | None = field(default=None, metadata=_opt(
        "start from this checkpoint's weights and tokenizer (fine-tuning): a run or checkpoint folder, or a Hugging "
        "Face Hub name (user/name, user/name@revision); --set still applies", metavar='RUN'))
    from_scratch: bool = field(default=False, metadata=_opt(
        "random weights instead of the preset's pretrained towers (the tiny preset starts from the ones that "
        "ship in the package, vqa/weights/tiny, which fix its shape and tokenizer; docs/pretraining.md)"))
    new_words: int = field(default=0, metadata=_opt(
        "with pretrained weights and their tokenizer (the tiny preset's towers, --init-from, a pretrained "
        "decoder): give each of the training text's N most frequent words that the tokenizer spells in two or "
        "more pieces a token of its own, its embedding row started at the mean of its pieces' rows (0: off; "
        "docs/pretraining.md)", metavar="N"))
    resume: bool = field(default=False, metadata=_opt(
        "continue the run in --out where it stopped; options given now win over the saved ones"))
    seed: int = field(default=0, metadata=_opt("seed of the weights, data order and augmentation"))
    workers: int = field(default=-1, metadata=_opt("data loader workers per process (-1: 0 on CPU; on GPUs the "
                                                          "machine's cores divided among its GPUs, at most 16)"))
    device: str = field(default="auto", metadata=_opt("cpu, cuda, cuda:1, mps (auto: CUDA, else MPS, else CPU)"))
    precision: str = field(default="auto", metadata=_opt(
        "auto: bf16 autocast on GPUs with bf16 tensor cores, fp16 with loss scaling on older GPUs, fp32 "
        "elsewhere", choices=("auto", "fp32", "bf16", "fp16")))
    compile: bool | None = field(default=None, metadata=_opt(
        "torch.compile the training step, lengths padded to multiples of 8 so that few shapes compile (default: "
        "on CUDA; off on CPUs, where tiny's compiled step is no faster). The first step waits for the compiler"))
    shard: str = field(default="ddp", metadata=_opt(
        "how torchrun's processes hold the model: ddp (each a full copy of the weights, gradients and optimizer "
        "state) or fsdp (each 1/N of them, a block's weights gathered while it runs: for a model whose training "
        "does not fit one device replicated, at the cost of moving the weights between devices every step; "
        "AdamW or Muon; not with --precision fp16). One process trains unsharded; the checkpoints are the same "
        "either way, and a run resumes with the other or another number of processes", choices=SHARDS))
    dist_timeout: float = field(default=30.0, metadata=_opt(
        "minutes a collective may wait for the slowest rank under torchrun (NCCL's own default is 10)"))
    image_cache: str = field(default="auto", metadata=_opt(
        "decoded images in one memory-mapped file shared by all workers and ranks of a node: auto (in "
        "$VQA_CACHE/images, else ~/.cache/vqa/images, within --image-cache-budget; `vqa data cache` lists or "
        "clears it), off, or a file PATH (used whatever its size)", metavar='auto|off|PATH'))
    image_cache_budget: str = field(default="25%", metadata=_opt(
        "total size of auto's cache folder, least recently used files not in use removed to fit: a share of "
        "RAM (25%) or a size (8G)", metavar='SIZE'))
    max_unreadable: float = field(default=0.01, metadata=_opt(
        "share of a data folder's training pictures that may be unreadable or over the pixel limit: each is "
        "skipped with one warning line; past the share the run stops, saying so (`vqa data info --check-images` "
        "lists them; shards skip every bad sample)", metavar='SHARE'))
    hflip: bool = field(default=False, metadata=_opt(
        "augment with horizontal flips (never for an image whose questions, answers or captions say left or "
        "right; refused for a set whose pictures must never be mirrored: Glyphs)"))

    grad_checkpointing: bool = field(default=False, metadata=_opt(
        "activation checkpointing of every decoder and ViT block: the backward pass recomputes each block, so "
        "a step stores one tensor per block instead of all its activations (less memory, about one more forward "
        "pass of compute)"))
    lora_rank: int | None = field(default=None, metadata=_opt(
        "train LoRA adapters of this rank on --lora-targets instead of their weights; the cross-attention and "
        "the image projection train in full. Saved beside the model; vqa export and the Predictor merge them",
        metavar="R"))
    lora_alpha: float = field(default=8.0, metadata=_opt(
        "LoRA's scale numerator: an adapter adds (alpha / rank) B A x (peft's default, 8)"))
    lora_targets: tuple = field(default=("self_attn", "mlp"), metadata=_opt(
        "the layers LoRA adapts: self_attn and mlp of the language model, vit (every linear layer of the "
        "ViT's blocks, which then freezes the rest of the ViT) (comma-separated)", metavar="TARGETS"))
    report_to: str = field(default="none", metadata=_opt(
        "also log the loss, learning rates, evaluation scores and captioned validation pictures to "
        "tensorboard (RUN/tensorboard; extra [tensorboard]), wandb or trackio (project vqa or $WANDB_PROJECT / "
        "$TRACKIO_PROJECT; --resume continues the same tracker run; extras [wandb], [trackio]); metrics.jsonl "
        "is always written", choices=("none", "tensorboard", "wandb", "trackio")))

    def __post_init__(self) -> None:
        self.tasks = parse_tasks(self.tasks)
        self.lora_targets = parse_targets(self.lora_targets)
        if not isinstance(self.model, dict):
            raise ConfigError(f"model overrides must be a mapping of field names to values, got {self.model!r}")
        self.model = check_fields(ModelConfig, self.model, "model config")
        for key, value in self.model.items():
            problem = check_field(key, value)
            if problem:
                shown = value if isinstance(value, str) else json.dumps(value)
                raise ConfigError(f"--set {key}={shown}: {problem}")
        given = [f for f in LENGTH_FIELDS if getattr(self, f) is not None]
        if len(given) > 1:
            raise ConfigError("give one of --epochs, --max-steps, --time-limit, not " + " and ".join(given))
        self._check_values()
        if self.train_only is not None:
            self.train_only = _names(self.train_only, PARTS, "--train-only")
            for part, given in (("encoder", self.vit_lr), ("decoder", self.dec_lr)):
                if part not in self.train_only and given:
                    flag = "--vit-lr" if part == "encoder" else "--dec-lr"
                    raise ConfigError(f"{flag} {given} trains the {part}, but --train-only "
                                      f"{','.join(self.train_only)} freezes it")

    def _check_values(self) -> None:
        """Every option of a number or switch of the right type and in its range (`RANGES`), each task with
        examples per image, and a time limit of more than nothing: ConfigError naming the option."""
        flags = {f.name: f.metadata.get("flag") or "--" + f.name.replace("_", "-") for f in dataclasses.fields(self)}
        for name, flag in flags.items():  # (paths and names may come as Path objects, a duration as a number)
            problem = scalar_type(TrainConfig, name)[0] is not str and type_problem(
                TrainConfig, name, getattr(self, name), label=flag)
            if problem:
                raise ConfigError(f"{problem}, got {getattr(self, name)!r}")
        for name, (lo, above) in RANGES.items():
            value = getattr(self, name)
            problem = number_problem(flags[name], value, lo, above=above,
                                     integer=scalar_type(TrainConfig, name)[0] is int)
            if problem:
                raise ConfigError(f"{problem}, got {value}")
        for task, name in TASK_COUNTS.items():
            if task in self.tasks and getattr(self, name) < 1:
                raise ConfigError(f"{flags[name]} must be >= 1 while --tasks includes {task} (0 never trains "
                                  f"it), got {getattr(self, name)}")
        if self.shard not in SHARDS:
            raise ConfigError(f"--shard {self.shard!r}: choose one of {', '.join(SHARDS)}")
        if self.shard == "fsdp" and self.precision == "fp16":
            raise ConfigError("--shard fsdp does not take --precision fp16 (its loss scaling is not set up for "
                              "sharded gradients); use --precision bf16")
        if self.time_limit is not None and not parse_duration(self.time_limit) > 0:
            raise ConfigError(f"--time-limit must be longer than 0 seconds, got {self.time_limit!r}")

    @classmethod
    def from_dict(cls, d: dict, what: str | None = None):
        if isinstance(d, dict) and "cache_images" in d:  # runs saved before the shared image cache
            d = {k: v for k, v in d.items() if k != "cache_images"} | (
                {} if "image_cache" in d else {"image_cache": "auto" if d["cache_images"] else "off"})
        return super().from_dict(d, what)

    def with_preset_defaults(self) -> TrainConfig:
        """lr and optimizer (when not given) and the preset's other training defaults filled in."""
        p = get_preset(self.preset)
        return dataclasses.replace(self, lr=self.lr if self.lr is not None else p.lr,
                                   optimizer=self.optimizer or p.optimizer)

    @property
    def encoder_lr(self) -> float:
        return self.lr * self.vit_lr_scale if self.vit_lr is None else self.vit_lr

    @property
    def decoder_lr(self) -> float:
        return self.lr * self.dec_lr_scale if self.dec_lr is None else self.dec_lr

    @property
    def frozen_parts(self) -> tuple[str, ...]:
        """The parts (`PARTS`) that --train-only leaves out."""
        return () if self.train_only is None else tuple(p for p in PARTS if p not in self.train_only)

    @property
    def dec_pretrained(self) -> str | None:
        """The language model the decoder starts from (a --set or the preset's), if any."""
        return preset_fields(self.preset, self.model).get("dec_pretrained")


def train_defaults(preset_name: str) -> dict:
    """TrainConfig defaults that a preset changes (beyond lr and optimizer)."""
    extra = get_preset(preset_name).train
    check_fields(TrainConfig, extra, f"preset {preset_name!r} train")
    return dict(extra)


def parse_duration(text: str) -> float:
    """'10m' -> 600.0 seconds ('90s', '1.5h', or a bare number of seconds)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text or ""))
    if not m:
        raise ConfigError(f"--time-limit {text!r}: use a number with s, m or h (e.g. 10m)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
