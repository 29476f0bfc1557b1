"""A new run's tokenizer and model: the pretrained decoder's own tokenizer, a given tokenizer.json, or BPE
trained on the training text (once, on rank 0, sent to the other ranks); the preset's model, or another
run's weights (`--init-from`) with this run's `--set` applied; and the device's defaults for what was not
given (images per GPU from a memory estimate, loader workers from the cores)."""

from __future__ import annotations

import contextlib
import os

import torch

from ..config import ModelConfig, TrainConfig, get_preset, preset_fields
from ..data.sources import training_texts
from ..data.synthetic.generator import mirror_safe
from ..distributed import Dist
from ..errors import ConfigError
from ..identity import checkpoint_identity
from ..logs import get_logger
from ..model import VQAModel
from ..tokenizer import Tokenizer
from ..weights import checkpoint, lora, shipped
from ..weights.grow_vocab import grow_embedding
from ..weights.language_model import LM_FIELDS, build_model, model_preset, tokenizer
from . import sharding
from .new_words import check_new_words
from .optim import part_of

log = get_logger("train")
VOCAB_SIZE = 8000  # BPE tokens of a tokenizer trained on the training text, when --vocab-size is not given


def new_tokenizer(cfg: TrainConfig, train_data, dist: Dist) -> Tokenizer:
    """The tokenizer of a new run: the pretrained decoder's own, a given tokenizer.json, or BPE trained on
    the training text. (The texts too long for dec_max_len in its tokens: `vqa.data.lengths`.)"""
    source = cfg.dec_pretrained
    if source:
        if cfg.tokenizer:
            raise ConfigError(f"--tokenizer {cfg.tokenizer}: a pretrained decoder (dec_pretrained={source!r}) "
                              "brings its own tokenizer; leave --tokenizer out")
        return tokenizer(source)
    if cfg.tokenizer:
        return Tokenizer.load(cfg.tokenizer)
    return _trained_bpe(cfg, train_data, dist)


def _trained_bpe(cfg: TrainConfig, train_data, dist: Dist) -> Tokenizer:
    """BPE trained once, on rank 0, and sent to the other ranks (no shared file system needed)."""
    text = [None]
    if dist.main:
        tok = Tokenizer.train(training_texts(train_data), vocab_size=cfg.vocab_size or VOCAB_SIZE)
        text = [tok.hf.to_str()]
    if dist.world > 1:
        torch.distributed.broadcast_object_list(text, src=0)
    if dist.main:
        return tok
    from tokenizers import Tokenizer as HFTokenizer

    return Tokenizer(HFTokenizer.from_str(text[0]))


def new_model(cfg: TrainConfig, tok: Tokenizer) -> VQAModel:
    """The preset's model (with --set), sized to `tok`; the same initial weights on every rank."""
    torch.manual_seed(cfg.seed)
    return build_model(model_preset(cfg.preset, **{**cfg.model, **tok.model_ids()}))


def check_model_options(cfg: TrainConfig) -> None:
    """At start-up, before the run folder or the data is touched: a new run's --set options that contradict
    its pretrained language model (`model_preset` reads the model's config.json and names them), and a
    --vocab-size or --new-words that cannot apply."""
    check_vocab_size(cfg)
    check_new_words(cfg, shipped_towers(cfg))
    if cfg.dec_pretrained and not cfg.resume and not cfg.init_from:
        model_preset(cfg.preset, **cfg.model)


def check_vocab_size(cfg: TrainConfig) -> None:
    """--vocab-size on a new run whose tokenizer is not trained here (it would be ignored) stops here, in one
    line naming where the tokenizer comes from and the way out."""
    if cfg.vocab_size is None or cfg.resume:
        return
    flag = f"--vocab-size {cfg.vocab_size}"
    if cfg.vocab_size < 1:
        raise ConfigError(f"{flag}: must be >= 1")
    lm = preset_fields(cfg.preset, cfg.model).get("dec_pretrained")
    if cfg.tokenizer:
        why = f"--tokenizer {cfg.tokenizer} gives the tokenizer; leave one of them out"
    elif cfg.init_from:
        why = f"the run starts from --init-from {cfg.init_from}, whose tokenizer it keeps; leave --vocab-size out"
    elif lm:
        why = f"the pretrained decoder ({lm}) brings its own tokenizer; leave --vocab-size out"
    elif (name := shipped_towers(cfg)) is not None:
        why = (f"the {cfg.preset} preset starts from pretrained towers with their own tokenizer (vqa/weights/{name}); "
               "leave --vocab-size out, or add --from-scratch to train a tokenizer of that size")
    else:
        return
    raise ConfigError(f"{flag} cannot apply: {why}")


def check_flips(cfg: TrainConfig) -> None:
    """--hflip on a set whose pictures must never be mirrored (Glyphs: a mirrored K is not a K) stops here."""
    if cfg.hflip and not mirror_safe(cfg.data):
        raise ConfigError(f"--hflip: {cfg.data} is a set whose pictures must never be mirrored (a mirrored "
                          "character is another character, or none); train it without --hflip")


def init_from(cfg: TrainConfig, path: str) -> tuple[VQAModel, Tokenizer, dict]:
    """The weights and tokenizer of another run, with this run's --set applied to its config. A captioner
    imported from transformers (`vqa import`: no <question> / <answer>) gains those two tokens, its embedding
    two rows (`vqa.weights.grow_vocab`); a shorter dec_max_len keeps the first rows of learned positions."""
    src, tok, card = checkpoint.load(path)
    started = dict(init_from=str(path), init_identity=checkpoint_identity(checkpoint.resolve(path)))
    if tok.question_id is None:
        tok = tok.with_prompt_tokens()
        src = grow_embedding(src, tok.vocab_size)
        log.info(f"vqa train: {path} is a captioner: its tokenizer gains <question> and <answer> as special tokens "
                 f"(embedding and LM head grown to {tok.vocab_size} rows)")
    changed = [f"{k}={cfg.model[k]!r}" for k in LM_FIELDS if k in cfg.model and cfg.model[k] != getattr(src.cfg, k)]
    if changed and (src.cfg.dec_pretrained or cfg.model.get("dec_pretrained")):
        raise ConfigError(f"--init-from {path}: --set {', '.join(changed)} cannot be combined with its decoder "
                          f"(dec_pretrained={src.cfg.dec_pretrained!r}): the weights are that run's, and the "
                          "decoder would no longer compute as the language model it started from")
    mcfg = ModelConfig.from_dict({**src.cfg.to_dict(), **cfg.model})
    if mcfg == src.cfg:
        return src, tok, started
    model = VQAModel(mcfg)  # the source's weights, not the language model's
    state = src.state_dict()
    pos = state.get("decoder.pos.weight")
    if pos is not None and mcfg.dec_positions == "learned" and mcfg.dec_max_len < pos.shape[0]:
        state["decoder.pos.weight"] = pos[: mcfg.dec_max_len]  # positions past the new context are never used
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        changed = sorted(k for k in cfg.model if src.cfg.to_dict().get(k) != mcfg.to_dict()[k])
        raise ConfigError(f"--init-from {path}: --set {', '.join(changed)} changes the model's shape, so its "
                          f"weights cannot be reused ({str(e).splitlines()[0]})") from None
    return model, tok, started


def shipped_towers(cfg: TrainConfig) -> str | None:
    """The shipped pretrained towers a new run of this preset starts from: none with --from-scratch, or where
    --set names other pretrained weights (a language model, timm's ViT), which then start from those."""
    own = any(cfg.model.get(k) for k in ("dec_pretrained", "vit_pretrained", "vit_weights"))
    return None if cfg.from_scratch or own else get_preset(cfg.preset).weights


def init_from_shipped(cfg: TrainConfig) -> tuple[VQAModel, Tokenizer, dict]:
    """The preset's shipped towers, with this run's --set applied (those that keep their shape: dropout, say).
    Options that contradict them (a shape, another tokenizer) are refused with the way out, --from-scratch."""
    name = shipped_towers(cfg)
    if cfg.tokenizer:
        raise ConfigError(f"--tokenizer {cfg.tokenizer}: the {cfg.preset} preset starts from pretrained towers "
                          f"that bring their own tokenizer (vqa/weights/{name}); leave --tokenizer out, or add "
                          "--from-scratch to train from random weights")
    try:
        model, tok, _ = init_from(cfg, str(shipped.folder(name)))
    except ConfigError as e:
        why = str(e).split(": ", 1)[1]
        raise ConfigError(f"the {cfg.preset} preset starts from pretrained towers (vqa/weights/{name}): {why}; add "
                          "--from-scratch to train this shape from random weights") from None
    return model, tok, dict(init_from=shipped.describe(name))


def default_workers(device: torch.device) -> int:
    """Loader workers per process when --workers is not given: none on a CPU (the step needs the cores), else
    the machine's cores shared among the GPUs of this node, at most 16 (decoding images is per-core work)."""
    if device.type == "cpu":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, min(16, cores // max(1, per_node) - 1))


# training memory per image, in bytes per (token x width x layer) of the ViT and the decoder: fitted with a
# margin to small's and base's peaks on a GPU (docs/results/performance.md, H100); with activation checkpointing
# a layer keeps only its input (bf16: 2 bytes, fp32 4) and one layer at a time holds its full activations
BYTES_PER_TOKEN_WIDTH_LAYER = 48
CHECKPOINTED_BYTES_PER_TOKEN_WIDTH_LAYER = 4
TEXT_TOKENS = 80  # an image's packed questions and caption
LORA_RANK_ADVICE = 16


def memory_options(cfg: TrainConfig, model: VQAModel) -> None:
    """--lora-rank (adapters on the language model, its other weights and, with `vit`, the ViT's frozen; the
    cross-attention trains in full) and --grad-checkpointing, on a new or resumed model."""
    saved = lora.adapter_settings(model)  # a resumed run's
    wanted = cfg.lora_rank and dict(rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=list(cfg.lora_targets))
    if saved and saved != wanted:
        given = f"--lora-rank {cfg.lora_rank} --lora-alpha {cfg.lora_alpha:g} --lora-targets " + ",".join(
            cfg.lora_targets) if cfg.lora_rank else "none"
        raise ConfigError(f"the run's adapters have rank {saved['rank']}, alpha {saved['alpha']:g}, targets "
                          f"{','.join(saved['targets'])}; resume it with those (given: {given})")
    if cfg.lora_rank and not saved:
        lora.add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    if lora.lora_layers(model):
        adapted = ("decoder", "encoder") if "vit" in (lora.adapter_settings(model) or {})["targets"] else ("decoder",)
        lora.freeze_base(model, lambda name: part_of(name) in adapted)
    model.set_grad_checkpointing(cfg.grad_checkpointing)


def estimated_bytes(model, batch: int, checkpointing: bool = False, shards: int = 1) -> int:
    """Estimated peak training memory of one device for `batch` images: 16 bytes a trained parameter (weights,
    gradients, AdamW's two moments), 4 a frozen one, plus the activations (BYTES_PER_TOKEN_WIDTH_LAYER).
    `shards` > 1 (--shard fsdp over that many processes): each keeps 1/shards of the 16 or 4 bytes, plus the
    full weights of the groups it gathers (`sharding.gathered_parameters`); the activations are the same."""
    vit, cfg = model.vision.vit, model.cfg
    towers = (((cfg.grid**2 + model.vision.num_prefix) * vit.embed_dim, len(vit.blocks)),
              (TEXT_TOKENS * cfg.dec_width, cfg.dec_depth))
    if checkpointing:
        per_image = sum(tw * (CHECKPOINTED_BYTES_PER_TOKEN_WIDTH_LAYER * n + BYTES_PER_TOKEN_WIDTH_LAYER)
                        for tw, n in towers)
    else:
        per_image = sum(BYTES_PER_TOKEN_WIDTH_LAYER * tw * n for tw, n in towers)
    trained = model.num_parameters(trainable_only=True)
    state = 16 * trained + 4 * (model.num_parameters() - trained)
    if shards > 1:
        state = state // shards + 4 * sharding.gathered_parameters(model)
    return state + batch * per_image


def memory_advice(model, batch: int, total: int, checkpointing: bool, lora_rank: int | None,
                  share: float = 0.9, shards: int = 1, world: int = 1) -> str:
    """One line: the estimated peak memory of a step of `batch` images against `total` bytes of device memory,
    and where it exceeds `share` of it, the option that would make it fit (checkpointing, then sharding over
    the `world` processes of a DDP run, then LoRA, then a smaller batch with accumulation). `shards`: the
    processes of a --shard fsdp run."""
    gib = 2**30

    def est(m, b, ckpt):  # one device's share of a sharded step, or the whole replicated one
        return estimated_bytes(m, b, ckpt, shards)

    need, room = est(model, batch, checkpointing), share * total
    each = f", each of {shards} sharded processes" if shards > 1 else ""
    line = (f"estimated peak training memory {need / gib:.2f} GiB for {batch} images a step{each}, of "
            f"{total / gib:.1f} GiB")
    if need <= room:
        return line
    if not checkpointing and est(model, batch, True) <= room:
        return line + f": it may not fit; --grad-checkpointing would need ~{est(model, batch, True) / gib:.2f} GiB"
    if shards == 1 and world > 1 and (sharded := estimated_bytes(model, batch, checkpointing, world)) <= room:
        return line + f": it may not fit; --shard fsdp would need ~{sharded / gib:.2f} GiB a process"
    if not lora_rank:
        with _adapted(model) as adapted:
            for ckpt in (checkpointing, True):
                if est(adapted, batch, ckpt) <= room:
                    flags = f"--lora-rank {LORA_RANK_ADVICE}" + (
                        " --grad-checkpointing" if ckpt and not checkpointing else "")
                    return line + f": it may not fit; {flags} would need ~{est(adapted, batch, ckpt) / gib:.2f} GiB"
    smaller = batch // 2
    while smaller >= 1 and est(model, smaller, checkpointing) > room:
        smaller //= 2
    if smaller >= 1:
        return line + (f": it may not fit; --batch-size {smaller} --accum {-(-batch // smaller)} trains the same "
                       f"{batch} images a step in ~{est(model, smaller, checkpointing) / gib:.2f} GiB")
    return line + ": it may not fit even one image a step; try a smaller preset"


def shards_of(cfg: TrainConfig, world: int) -> int:
    """How many processes share the model's state: --shard fsdp's world (one process trains unsharded)."""
    return world if cfg.shard == "fsdp" and world > 1 else 1


def memory_line(model, batch: int, device: torch.device, cfg: TrainConfig, world: int = 1) -> str | None:
    """`memory_advice` against a GPU's memory (None elsewhere: a CPU's memory is the machine's)."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    return memory_advice(model, batch, total, cfg.grad_checkpointing, cfg.lora_rank, shards=shards_of(cfg, world),
                         world=world)


@contextlib.contextmanager
def _adapted(model):
    """`model` with LoRA adapters and frozen towers for an estimate, put back as it was on exit (trainable
    flags included): the parameter counts are what the estimate reads."""
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    lora.add_lora(model, LORA_RANK_ADVICE, 8.0, ("self_attn", "mlp"))
    lora.freeze_base(model, lambda name: part_of(name) == "decoder")
    try:
        yield model
    finally:
        lora.remove_lora(model)
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])


def default_batch(model, device: torch.device, share: float = 0.6, most: int = 256,
                  checkpointing: bool = False, shards: int = 1) -> int:
    """Images per device when --batch-size is not given: 32 on a CPU; on a GPU the largest power of two up to
    `most` whose estimated training memory (`estimated_bytes`) fits in `share` of the GPU's memory."""
    if device.type != "cuda":
        return 32
    room = share * torch.cuda.get_device_properties(device).total_memory
    batch = 8
    while batch * 2 <= most and estimated_bytes(model, batch * 2, checkpointing, shards) <= room:
        batch *= 2
    return batch
