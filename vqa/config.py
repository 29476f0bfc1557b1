"""The three configurations and the named presets.

- `ModelConfig`: the architecture, saved as `config.json` beside `model.safetensors` in every checkpoint.
  Fields are prefixed by the part they configure (`vit_*` image encoder, `dec_*` text decoder), as in nanoVLM.
- `TrainConfig`: everything `vqa train` takes (the command line is generated from it, see `vqa.options`);
  a run folder keeps the resolved one as `train_config.json`.
- `GenerationConfig`: how text is decoded (greedy, beam search, sampling), validated here and passed whole
  through `generate`, the `Predictor`, the CLI, evaluation and the app.

A preset is one entry of `PRESETS`: its model fields and its training defaults together.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

# Options that were removed (docs/tried.md), each with its old default. A saved config.json, train_config.json
# or --config file that still holds one at that value loads as if the field were absent; at any other value it
# is refused in one line naming the option: the code that served it is gone (REMOVED_IN has it).
REMOVED_FIELDS: dict[str, dict[str, Any]] = {
    "ModelConfig": dict(dec_rope=False, dec_cross_rope=False, dec_cross_rope_follow=False, dec_cross_coords=False,
                        vit_keep_prefix=True),
    "TrainConfig": dict(question_weights={}, transpose=0.0),
}
REMOVED_IN = "cb9f6a9"  # the last commit with their code


def check_fields(cls, d: dict, what: str) -> dict:
    """Raise ConfigError naming unknown keys of `d` (and the closest field names) for dataclass `cls`, or a
    removed option (REMOVED_FIELDS) set to anything but its old default; return `d` without removed fields."""
    removed = REMOVED_FIELDS.get(cls.__name__, {})
    for key in sorted(set(d) & set(removed)):
        if d[key] != removed[key]:
            raise ConfigError(f"{what} {key}={d[key]!r}: vqa no longer has this option (docs/tried.md; its code "
                              f"is in commit {REMOVED_IN})")
    d = {k: v for k, v in d.items() if k not in removed}
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(known))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
            close += [k for k in known if len(key) > 3 and key in k and k not in close]  # beams -> num_beams
            hints.append(f"{key!r}" + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""))
        raise ConfigError(f"unknown {what} field(s): {', '.join(hints)}")
    return d


class _Config:
    """to_dict / from_dict / save / load / replace for the config dataclasses."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, what: str | None = None):
        if not isinstance(d, dict):
            raise ConfigError(f"a {cls.__name__} must be a JSON object, got {type(d).__name__}")
        d = check_fields(cls, d, what or cls.__name__)
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(f"{cls.__name__}: {e}") from None

    def replace(self, **changes):
        changes = check_fields(type(self), changes, type(self).__name__)
        return dataclasses.replace(self, **changes)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path):
        try:
            return cls.from_dict(json.loads(Path(path).read_text()), what=f"{path}:")
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from e


# ------------------------------------------------------------------------------------------------- model


@functools.lru_cache(maxsize=64)
def timm_data_config(vit_name: str) -> dict:
    """timm's input size, mean and std for `vit_name` (a model name, optionally with its weights' tag, e.g.
    `vit_small_patch16_224.augreg_in1k`): `timm.data.resolve_data_config` on the model's pretrained config,
    what `resolve_model_data_config(create_model(vit_name))` gives without building the model."""
    import timm
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    if not timm.is_model(vit_name):
        close = timm.list_models(f"*{vit_name.split('_')[0]}*")[:8] if vit_name else []
        raise ConfigError(f"unknown timm model {vit_name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    cfg = get_pretrained_cfg(vit_name)
    return resolve_data_config(pretrained_cfg=cfg.to_dict() if cfg is not None else {})


DEC_ACTIVATIONS = ("gelu", "gelu_tanh")


@dataclass
class ModelConfig(_Config):
    # image encoder (any timm ViT; `vit_name` picks the architecture and, after a dot, the weights' tag)
    vit_name: str = "vit_tiny_patch16_224"  # a timm ViT, optionally with its weights' tag after a dot
    vit_image_size: int | None = None  # None: timm's input size for vit_name
    vit_patch_size: int = 16  # pixels per patch side (a power of two with vit_conv_stem)
    vit_width: int | None = None  # None: the timm model's own width; set for a custom-size ViT
    vit_depth: int | None = None  # None: the timm model's own number of blocks
    vit_heads: int | None = None  # None: the timm model's own number of attention heads
    vit_pretrained: bool = False  # timm's own download (needs internet)
    vit_weights: str | None = None  # a local .safetensors / .pth file of timm ViT weights
    vit_conv_stem: bool = False  # 3x3 stride-2 convolutions instead of the patch projection (from scratch)
    vit_qk_norm: bool = False  # LayerNorm on each head's queries and keys (timm's qk_norm)
    vit_memory_pos: bool = False  # add fixed 2-D sin-cos positions to the image tokens the decoder attends to
    vit_freeze: bool = False  # no gradients for the ViT (its projection to the decoder still trains)
    vit_mean: tuple[float, float, float] | None = None  # None: timm's for vit_name (its weights' statistics)
    vit_std: tuple[float, float, float] | None = None  # None: timm's for vit_name, like vit_mean
    # text decoder
    dec_pretrained: str | None = None  # a causal LM folder (Hugging Face layout) or Hub name: its weights start the decoder
    dec_width: int = 192  # the decoder's model width (the image tokens are projected to it)
    dec_depth: int = 3  # decoder blocks (self-attention, cross-attention, MLP)
    dec_heads: int = 4  # attention heads per layer (dec_width must divide by it)
    dec_mlp_ratio: float = 4.0  # the MLP's hidden width / dec_width
    dec_max_len: int = 64  # the longest prompt + target, in tokens
    dec_positions: str = "sinusoidal"  # the positions added to the tokens: "sinusoidal" (fixed) or "learned"
    dec_dropout: float = 0.0  # dropout in the decoder (embeddings, attention, residual branches) while training
    dec_qk_norm: bool = False  # LayerNorm on each head's queries and keys (self- and cross-attention)
    dec_activation: str = "gelu"  # the MLP's: "gelu" (exact) or "gelu_tanh" (GPT-2's gelu_new)
    dec_embed_scale: bool = True  # token embeddings x sqrt(dec_width) before the positions are added (GPT-2: no)
    dec_norm_eps: float = 1e-5  # the decoder's LayerNorm epsilon
    vocab_size: int = 1024  # set from the tokenizer when a model is built for a data set
    pad_id: int = 0  # the tokenizer's <pad> id (set with vocab_size)
    bos_id: int = 1  # the tokenizer's <bos> id
    eos_id: int = 2  # the tokenizer's <eos> id: generation stops at it

    def __post_init__(self) -> None:
        if self.vit_image_size is None or self.vit_mean is None or self.vit_std is None:
            data = timm_data_config(self.vit_name)
            self.vit_image_size = self.vit_image_size or int(data["input_size"][-1])
            self.vit_mean = self.vit_mean or data["mean"]
            self.vit_std = self.vit_std or data["std"]
        self.vit_mean = tuple(float(m) for m in self.vit_mean)
        self.vit_std = tuple(float(s) for s in self.vit_std)
        if self.dec_width % self.dec_heads:
            raise ConfigError(f"dec_width={self.dec_width} is not divisible by dec_heads={self.dec_heads}")
        if self.dec_positions not in ("sinusoidal", "learned"):
            raise ConfigError(f"dec_positions must be 'sinusoidal' or 'learned', not {self.dec_positions!r}")
        if self.dec_activation not in DEC_ACTIVATIONS:
            raise ConfigError(f"dec_activation must be one of {', '.join(map(repr, DEC_ACTIVATIONS))}, "
                              f"not {self.dec_activation!r}")
        if self.vit_memory_pos and self.dec_width % 4:
            raise ConfigError(f"vit_memory_pos needs dec_width divisible by 4, not {self.dec_width}")
        if self.vit_image_size % self.vit_patch_size:
            raise ConfigError(
                f"vit_image_size={self.vit_image_size} is not a multiple of vit_patch_size={self.vit_patch_size}"
            )

    @property
    def grid(self) -> int:
        """Image patches per side."""
        return self.vit_image_size // self.vit_patch_size


# ------------------------------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """A named starting point: the model's fields and the training defaults that suit it. `lr` and
    `optimizer` have no default on purpose: every preset says what it was tuned with."""

    model: dict
    lr: float
    optimizer: str
    train: dict = field(default_factory=dict)  # any other TrainConfig field, e.g. vit_lr_scale
    about: str = ""


# the decoder layout of GPT-2 (learned positions, tanh GELU, no embedding scale, no QK-norm)
GPT2_DECODER = dict(dec_positions="learned", dec_activation="gelu_tanh", dec_embed_scale=False, dec_qk_norm=False)

PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        about="trains on 2 CPU cores in minutes (docs/shapes-10min.md): a narrow 3-layer ViT on 64 px images "
              "with a conv stem down to 8 px patches, a 3-layer decoder, QK-norm everywhere, fixed 2-D "
              "positions on the memory",
        model=dict(
            vit_name="vit_tiny_patch16_224", vit_image_size=64, vit_patch_size=8,
            vit_width=96, vit_depth=3, vit_heads=2, vit_conv_stem=True, vit_qk_norm=True, vit_memory_pos=True,
            dec_width=96, dec_depth=3, dec_heads=3, dec_max_len=48, dec_qk_norm=True,
        ),
        # a from-scratch encoder that moves more slowly than the decoder lets the cross-attention settle
        # sooner; Muon learns the from-scratch model in far fewer steps (docs/shapes-10min.md, sections 4-5)
        lr=1e-3, optimizer="muon", train=dict(vit_lr_scale=0.3),
    ),
    "small": Preset(
        about="ViT-S/16 at 224 px + a 6-layer decoder (GPU); timm's layout, so pretrained weights load",
        model=dict(vit_name="vit_small_patch16_224", vit_patch_size=16, dec_width=384, dec_depth=6, dec_heads=6,
                   dec_max_len=64),
        lr=3e-4, optimizer="adamw",
    ),
    "base": Preset(
        about="ViT-B/16 at 224 px + an 8-layer decoder (GPU); timm's layout, so pretrained weights load",
        model=dict(vit_name="vit_base_patch16_224", vit_patch_size=16, dec_width=768, dec_depth=8, dec_heads=12,
                   dec_max_len=64),
        lr=1e-4, optimizer="adamw",
    ),
    # Pretrained towers (docs/pretrained.md): timm's ImageNet-21k ViT and a GPT-2 from the Hugging Face Hub,
    # joined by new cross-attention layers that start at zero contribution. The decoder fields repeat the
    # language model's config.json (it overrides them anyway), so dec_pretrained=None builds the same shapes.
    # Three learning rates: --lr for the new layers, x dec_lr_scale for the pretrained decoder, x vit_lr_scale
    # for the pretrained encoder (starting points from the fine-tuning literature, not tuned here).
    "small-gpt2": Preset(
        about="ViT-S/16 (timm's weights) + DistilGPT-2 (6 layers, 768 wide, distilbert/distilgpt2) joined by new "
              "cross-attention (GPU; downloads both)",
        model=dict(vit_name="vit_small_patch16_224", vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained="distilbert/distilgpt2", dec_max_len=64, **GPT2_DECODER,
                   dec_width=768, dec_depth=6, dec_heads=12),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.2, vit_lr_scale=0.1),
    ),
    "base-gpt2": Preset(
        about="ViT-B/16 (timm's weights) + GPT-2 (12 layers, 768 wide, openai-community/gpt2) joined by new "
              "cross-attention (GPU; downloads both)",
        model=dict(vit_name="vit_base_patch16_224", vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained="openai-community/gpt2", dec_max_len=64, **GPT2_DECODER,
                   dec_width=768, dec_depth=12, dec_heads=12),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.2, vit_lr_scale=0.1),
    ),
}

# naming another timm model brings its own architecture: these preset fields then give way to timm's
VIT_ARCHITECTURE = ("vit_width", "vit_depth", "vit_heads")


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_fields(name: str, overrides: dict) -> dict:
    """The named preset's model fields with `overrides` on top (before a pretrained language model's own
    fields are applied; see `preset`)."""
    overrides = check_fields(ModelConfig, overrides, "model config")
    fields = dict(get_preset(name).model)
    if "vit_name" in overrides and overrides["vit_name"] != fields.get("vit_name"):
        for key in VIT_ARCHITECTURE:
            fields.pop(key, None)
    return {**fields, **overrides}


def preset(name: str, **overrides) -> ModelConfig:
    """The named preset's ModelConfig with fields overridden by keyword. Overriding `vit_name` with another
    model drops the preset's ViT width, depth and heads (unless they are overridden too), so
    `vit_name=vit_small_patch16_224` gives a real ViT-S; image size, patch size and the preset's other
    choices (conv stem, QK-norm) stay unless overridden.

    A preset whose decoder starts from a pretrained language model (`dec_pretrained`) gets that model's
    architecture and vocabulary from `vqa.model.model_preset`, which reads the language model's files; this
    function knows none of them and builds the fields as written."""
    return ModelConfig(**preset_fields(name, overrides))


# ------------------------------------------------------------------------------------------------- training


def _tasks(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    tasks = tuple(dict.fromkeys(str(t).strip() for t in items if str(t).strip()))
    bad = [t for t in tasks if t not in ("vqa", "caption")]
    if bad or not tasks:
        raise ConfigError(f"tasks {value!r}: choose vqa, caption or vqa,caption")
    return tasks


# the parts of the model that train with their own learning rate, or not at all (vqa.train.optim.part_of)
PARTS = ("cross_attention", "decoder", "encoder")


def _parts(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    parts = tuple(dict.fromkeys(str(p).strip() for p in items if str(p).strip()))
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ConfigError(f"--train-only {value!r}: name one or more of {', '.join(PARTS)} (comma-separated)")
    return parts


def parse_tasks(value: Any) -> tuple[str, ...]:
    """'vqa, caption' / ['vqa'] -> a tuple of known task names (ConfigError otherwise)."""
    return _tasks(value)


LENGTH_FIELDS = ("epochs", "max_steps", "time_limit")


def _opt(help: str, **extra) -> Any:
    return dict(help=help, **extra)


@dataclass
class TrainConfig(_Config):
    """Everything `vqa train` takes. `vqa train --help` is generated from these fields and their help."""

    data: str = field(default="", metadata=_opt(
        "data folder (VQA v2 / COCO / JSONL files, or split folders of webdataset / parquet shards), or a "
        "shard pattern (shards/{00000..00099}.tar, https://..., pipe:...); see data/README.md", metavar='DIR'))
    out: str = field(default="", metadata=_opt("run folder: checkpoints best/ and last/, metrics.jsonl, curves.png", metavar='RUN'))
    preset: str = field(default="tiny", metadata=_opt("model and training defaults", choices=tuple(PRESETS)))
    model: dict = field(default_factory=dict, metadata=_opt(
        "override a model config field (repeatable); the fields, each with what it does: ModelConfig in "
        "vqa/config.py", flag="--set", metavar="FIELD=VALUE"))
    tasks: tuple = field(default=("vqa", "caption"), metadata=_opt("vqa, caption or both (comma-separated)"))
    epochs: float | None = field(default=None, metadata=_opt("train this many passes over the images"))
    max_steps: int | None = field(default=None, metadata=_opt("train this many optimizer steps"))
    time_limit: str | None = field(default=None, metadata=_opt(
        "train for this long (e.g. 10m, 90s, 1h); the cosine schedule is fitted to it", metavar='DURATION'))
    batch_size: int = field(default=32, metadata=_opt("images per device per micro-batch"))
    accum: int = field(default=1, metadata=_opt("micro-batches per optimizer step (gradient accumulation)"))
    questions_per_image: int = field(default=6, metadata=_opt("questions per image per step (Shapes has 6)"))
    captions_per_image: int = field(default=1, metadata=_opt("captions per image per step"))
    caption_weight: float = field(default=0.5, metadata=_opt(
        "loss weight of a caption token relative to an answer token (a caption has ~10x an answer's tokens; "
        "see docs/shapes-10min.md for the values tried)"))
    lr: float | None = field(default=None, metadata=_opt(
        "peak learning rate of the cross-attention layers; the decoder's and the encoder's default to "
        "fractions of it (default: the preset's)"))
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
    grad_clip: float = field(default=1.0, metadata=_opt("clip the global gradient norm to this (0: off)"))
    eval_every: int = field(default=0, metadata=_opt("steps between evaluations (0: four per run)"))
    eval_images: int = field(default=300, metadata=_opt(
        "val images scored by the evaluations during training (vqa eval scores them all)"))
    log_every: int = field(default=10, metadata=_opt("steps between log lines in metrics.jsonl"))
    train_split: str | None = field(default=None, metadata=_opt(
        "the split to train on (default: 'train', else the one split named train..., e.g. train2014)", metavar='SPLIT'))
    val_split: str | None = field(default=None, metadata=_opt(
        "the split evaluated during training (default: 'val', else the one named val..., e.g. val2014); "
        "with a shard pattern as --data, a shard pattern", metavar='SPLIT'))
    tokenizer: str | None = field(default=None, metadata=_opt(
        "use this tokenizer.json instead of training one on the training text", metavar='FILE'))
    vocab_size: int = field(default=8000, metadata=_opt("BPE vocabulary when training a tokenizer"))
    init_from: str | None = field(default=None, metadata=_opt(
        "start from this checkpoint's weights and tokenizer (fine-tuning); --set still applies", metavar='RUN'))
    resume: bool = field(default=False, metadata=_opt(
        "continue the run in --out where it stopped; options given now win over the saved ones"))
    seed: int = field(default=0, metadata=_opt("seed of the weights, data order and augmentation"))
    workers: int = field(default=-1, metadata=_opt("data loader workers (-1: 0 on CPU, 4 on GPU)"))
    device: str = field(default="auto", metadata=_opt("cpu, cuda, cuda:1, mps (auto: CUDA, else MPS, else CPU)"))
    precision: str = field(default="auto", metadata=_opt(
        "auto: bf16 autocast on CUDA, fp32 elsewhere", choices=("auto", "fp32", "bf16", "fp16")))
    compile: bool = field(default=False, metadata=_opt(
        "torch.compile the training step (batches padded to multiples of 8 so that few shapes compile)"))
    dist_timeout: float = field(default=30.0, metadata=_opt(
        "minutes a collective may wait for the slowest rank under torchrun (NCCL's own default is 10)"))
    image_cache: str = field(default="auto", metadata=_opt(
        "decoded images in one memory-mapped file shared by all workers and ranks of a node: auto (in the temp "
        "folder, when it fits --image-cache-budget), off, or a file PATH (used whatever its size)", metavar='auto|off|PATH'))
    image_cache_budget: str = field(default="25%", metadata=_opt(
        "largest image cache that auto makes: a share of RAM (25%) or a size (8G)", metavar='SIZE'))
    hflip: bool = field(default=False, metadata=_opt(
        "augment with horizontal flips (never for an image whose questions or captions say left or right)"))

    def __post_init__(self) -> None:
        self.tasks = _tasks(self.tasks)
        if not isinstance(self.model, dict):
            raise ConfigError(f"model overrides must be a mapping of field names to values, got {self.model!r}")
        self.model = check_fields(ModelConfig, self.model, "model config")
        given = [f for f in LENGTH_FIELDS if getattr(self, f) is not None]
        if len(given) > 1:
            raise ConfigError("give one of --epochs, --max-steps, --time-limit, not " + " and ".join(given))
        for name in ("batch_size", "accum", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.epochs is not None and not self.epochs > 0:
            raise ConfigError(f"epochs must be > 0, got {self.epochs}")
        if self.time_limit is not None:
            parse_duration(self.time_limit)
        if self.train_only is not None:
            self.train_only = _parts(self.train_only)
            for part, given in (("encoder", self.vit_lr), ("decoder", self.dec_lr)):
                if part not in self.train_only and given:
                    flag = "--vit-lr" if part == "encoder" else "--dec-lr"
                    raise ConfigError(f"{flag} {given} trains the {part}, but --train-only "
                                      f"{','.join(self.train_only)} freezes it")

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


# ------------------------------------------------------------------------------------------------- decoding

DECODING_METHODS = ("greedy", "beam", "sample")  # each is registered with its code in vqa.decoding.generate


ANSWER_TOKENS = 10  # VQA answers are a few words: the default budget when decoding answers


@dataclass
class GenerationConfig(_Config):
    """How to decode. `method` is one of `DECODING_METHODS` (greedy, beam, sample); each other field
    names the methods it applies to. Validated on creation, so a bad value fails before any work. The CLI
    options come from these fields, and the app shows a control for every field with `ui` metadata (a
    slider's (min, max, step), or "number")."""

    method: str = field(default="greedy", metadata=_opt("decoding method", choices=DECODING_METHODS))
    max_new_tokens: int | None = field(default=None, metadata=_opt(
        "longest output in tokens (default: 10 for answers, the model's context for captions)"))
    min_new_tokens: int = field(default=0, metadata=_opt("<eos> is not allowed before this many tokens"))
    num_beams: int = field(default=3, metadata=_opt("beam: hypotheses kept per prompt", ui=(1, 5, 1)))
    length_penalty: float = field(default=1.0, metadata=_opt(
        "beam: hypotheses rank by log-probability / length ** this (0: total log-probability)", ui=(0.0, 2.0, 0.1)))
    early_stopping: bool = field(default=False, metadata=_opt(
        "beam: stop a prompt as soon as it has num_beams ended hypotheses (Hugging Face's early_stopping=True); "
        "by default it stops only when no live beam can still beat them, so the result is that of running "
        "every beam to the end (their early_stopping='never')"))
    temperature: float = field(default=1.0, metadata=_opt("sample: divide the logits by this", ui=(0.1, 2.0, 0.1)))
    top_k: int = field(default=0, metadata=_opt("sample: keep the k likeliest tokens (0: all)", ui=(0, 50, 1)))
    top_p: float = field(default=1.0, metadata=_opt("sample: keep the smallest set of this probability",
                                                    ui=(0.05, 1.0, 0.05)))
    seed: int | None = field(default=None, metadata=_opt("sample: a seed for a reproducible output", ui="number"))

    def __post_init__(self) -> None:
        if self.method not in DECODING_METHODS:
            raise ConfigError(f"unknown decoding method {self.method!r}; choose one of: {', '.join(DECODING_METHODS)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ConfigError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.num_beams < 1:
            raise ConfigError(f"num_beams must be >= 1, got {self.num_beams}")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def for_task(cls, task: str, **changes) -> GenerationConfig:
        """The defaults for "vqa" (answers: at most ANSWER_TOKENS tokens) or "caption", then `changes`."""
        base = dict(max_new_tokens=ANSWER_TOKENS) if task == "vqa" else {}
        return cls.from_dict({**base, **changes})

    def budget(self, limit: int) -> int:
        """New tokens allowed for a prompt that leaves `limit` positions of the context."""
        return limit if self.max_new_tokens is None else min(self.max_new_tokens, limit)


__all__ = [
    "ModelConfig", "TrainConfig", "GenerationConfig", "Preset", "PRESETS", "preset", "get_preset",
    "train_defaults", "parse_duration", "parse_tasks", "timm_data_config", "ANSWER_TOKENS", "check_fields",
    "preset_fields", "PARTS", "DEC_ACTIVATIONS", "GPT2_DECODER",
]
