"""`generate`: decode a batch of prompts by the method its GenerationConfig names, candidate ranking
(`score_candidates`) and the cross-attention maps behind generated words.

A decoding method is a function `(decoder: DecodingBatch, config: GenerationConfig) -> Generation` in `METHODS`
(greedy, beam search in `vqa.decoding.beam`, sampling in `vqa.decoding.sample`), under the names that
`vqa.config.DECODING_METHODS` lists for the CLI. `generate` checks the inputs, builds the one
`vqa.decoding.batch.DecodingBatch` the method runs on (the
image's keys/values computed once, a preallocated KV cache, left-padded prompts each with its own length
budget, each new token through the fixed-shape step, eagerly or, with `compile=True`, through torch.compile)
and calls the method.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from einops import rearrange

from ..config import GenerationConfig
from ..errors import ConfigError, InputError
from ..model import VQAModel
from .batch import DecodingBatch, Generation, ban_bias, compiled_step
from .beam import beam_search
from .compiled import encode as encode_images
from .greedy import greedy
from .sample import sample

# the decoding methods, by the names `vqa.config.DECODING_METHODS` lists (tests/test_layers.py holds them equal)
METHODS: dict[str, Callable[[DecodingBatch, GenerationConfig], Generation]] = {
    "greedy": greedy, "beam": beam_search, "sample": sample}


def _check_ids(model: VQAModel, rows: list[list[int]]) -> None:
    vocab = model.cfg.vocab_size
    bad = next((t for r in rows for t in r if not 0 <= int(t) < vocab), None)
    if bad is not None:
        raise InputError(f"token id {bad} is outside the vocabulary (0..{vocab - 1}): wrong tokenizer?")


def generation_config(config: GenerationConfig | None, changes: dict,
                      default: GenerationConfig | None = None) -> GenerationConfig:
    """`config` (None: `default`, else GenerationConfig()) with the GenerationConfig fields in `changes`; a bad
    value is an InputError (the caller's input, not the program's configuration)."""
    try:
        return (config or default or GenerationConfig()).replace(**changes)
    except ConfigError as e:
        raise InputError(str(e)) from None


@torch.inference_mode()  # returns lists only: no autograd bookkeeping (docs/results/performance.md)
def generate(
    model: VQAModel,
    prompts: list[list[int]],
    images: torch.Tensor | None = None,  # [M, 3, S, S]
    *,
    memory: torch.Tensor | None = None,  # or the encoded images [M, N, D], to reuse an encoding
    image_index: torch.Tensor | list[int] | None = None,  # [B] prompt -> image; default prompt b -> image b
    config: GenerationConfig | None = None,
    vocab: Sequence[int] | torch.Tensor | None = None,  # only these token ids may be generated (and <eos>)
    banned: Sequence[int] | frozenset[int] | None = None,  # token ids never generated: Tokenizer.never_generated
    compile: bool = False,  # run the decode step through torch.compile (vqa.decoding.batch.compiled_step)
    watch: Callable[[list[list[int]]], None] | None = None,  # streaming: each prompt's tokens so far, every step
    **changes,  # GenerationConfig fields, over `config` (e.g. method="beam", num_beams=3)
) -> Generation:
    """Decode a continuation of every prompt until <eos> or its length budget, by `config.method`.

    `vocab` restricts what may follow to those tokens (a VQA model's answer vocabulary, say): the LM head is
    computed for them alone, and probabilities and scores are renormalized over them (the model's distribution
    given that the output stays in the vocabulary). `banned` are tokens no method ever generates: at every step
    (greedy, beam, sampling, eager or compiled) they are -inf where the method chooses, as <eos> is before
    `min_new_tokens`; pass the tokenizer's `never_generated` (every special token but <eos>: <bos>, <pad>,
    <unk>, the task markers), as the Predictor, evaluation and the ONNX runtime do. (The model alone does not
    know which of its ids are task markers: without `banned`, nothing is banned.) Scores stay the model's
    log-probabilities of the output (over `vocab` when there is one): what is excluded from the choice is
    not taken out of the normalization. `compile` compiles the decode step (its weights frozen in: for a
    model that is no longer trained); the result is that of the eager step. `watch` is called at every step
    with each prompt's tokens so far (beam search: its best hypothesis so far): streaming, which changes no
    result; an exception it raises stops the decoding."""
    config = generation_config(config, changes)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt needs at least one token (<bos>)")
    if memory is None:
        if images is None:
            raise InputError("generate needs images or memory")
        memory = encode_images(model, images, compile)
    if image_index is None:
        if memory.shape[0] != len(prompts):
            raise InputError(f"{memory.shape[0]} images for {len(prompts)} prompts and no image_index")
    else:
        if not torch.is_tensor(image_index):
            image_index = torch.as_tensor(image_index, dtype=torch.long, device=memory.device)
        image_index = image_index.to(memory.device)
        if (image_index.shape != (len(prompts),)
                or not 0 <= int(image_index.min()) <= int(image_index.max()) < memory.shape[0]):
            raise InputError(f"image_index must give each of the {len(prompts)} prompts one of the "
                             f"{memory.shape[0]} images")
    _check_ids(model, prompts)
    banned = _banned(model, banned)
    allowed = None if vocab is None else answer_vocab(model, vocab, banned)
    if allowed is not None and config.min_new_tokens > 0 and allowed.numel() == 1:
        raise InputError("the vocabulary allowed holds no token but <eos>, and min_new_tokens asks for at least "
                         f"{config.min_new_tokens}: nothing can be generated")
    kv = model.memory_kv(memory, image_index)
    ban = None if allowed is not None else ban_bias(model, banned)
    method = METHODS[config.method]
    # a compiled decoding's pooled buffers, at a CUDA graph's addresses, serve one decoding at a time
    with compiled_step(model.decoder).lock if compile else contextlib.nullcontext():
        decoder = DecodingBatch(model, kv, prompts, config, vocab=allowed, compiled=compile, ban=ban)
        decoder.watch = watch
        return method(decoder, config)


def _banned(model: VQAModel, banned) -> frozenset[int]:
    """`banned` as a frozenset of token ids, checked: inside the vocabulary, and never <eos>."""
    if banned is None:
        return frozenset()
    ids = frozenset(int(i) for i in (banned.tolist() if torch.is_tensor(banned) else banned))
    _check_ids(model, [sorted(ids)])
    if model.cfg.eos_id in ids:
        raise InputError(f"<eos> (id {model.cfg.eos_id}) cannot be banned: every output must be able to end")
    return ids


def answer_vocab(model: VQAModel, ids: Sequence[int] | torch.Tensor,
                 banned: frozenset[int] = frozenset()) -> torch.Tensor:
    """The sorted, distinct token ids of `ids` less the `banned` ones, and <eos> (every output must be able to
    end), as a tensor on the model's device; raises InputError for ids outside the vocabulary."""
    ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
    _check_ids(model, [ids])
    device = model.decoder.embed.weight.device
    keep = ({int(i) for i in ids} - set(banned)) | {model.cfg.eos_id}
    return torch.as_tensor(sorted(keep), dtype=torch.long, device=device)


@torch.no_grad()
def score_candidates(
    model: VQAModel, prompt: list[int], candidates: list[list[int]], images=None, memory=None
) -> torch.Tensor:
    """Log-likelihood of each candidate continuation (its tokens then <eos>) after `prompt`, for one image.
    Returns [C] total log-probabilities."""
    if not candidates:
        raise InputError("no candidates to rank")
    _check_ids(model, [prompt, *candidates])
    if not prompt:
        raise InputError("the prompt needs at least one token (<bos>)")
    if memory is None:
        memory = model.encode(images)
    cfg = model.cfg
    rows = [prompt + c + [cfg.eos_id] for c in candidates]
    width = max(len(r) for r in rows)
    if width > cfg.dec_max_len:
        raise InputError(f"prompt + candidate of {width} tokens exceeds dec_max_len={cfg.dec_max_len}")
    ids = torch.full((len(rows), width), cfg.pad_id, dtype=torch.long, device=memory.device)
    target = torch.zeros_like(ids, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(r)
        target[i, len(prompt) : len(r)] = True
    kv = model.memory_kv(memory, torch.zeros(len(rows), dtype=torch.long, device=memory.device))
    hidden, _ = model.decoder(ids, kv)  # [C, T, D]
    log_probs = F.log_softmax(model.decoder.logits(hidden[:, :-1]).float(), -1)  # predicts tokens 1..T-1
    token_log_probs = log_probs.gather(-1, ids[:, 1:, None])[..., 0]  # [C, T-1]
    return (token_log_probs * target[:, 1:]).sum(1)


@torch.no_grad()
def cross_attention_maps(model: VQAModel, memory: torch.Tensor, prompt: list[int],
                         generated: list[int]) -> torch.Tensor:
    """Cross-attention weights behind each generated token: [len(generated), layers, heads, N] for one image.
    The weights for token i are those of the query at the position that predicted it (teacher-forced, which
    equals the cached decoding)."""
    if not prompt:
        raise InputError("the prompt needs at least one token (<bos>)")
    if len(prompt) + len(generated) > model.cfg.dec_max_len:
        raise InputError(
            f"prompt + generated of {len(prompt) + len(generated)} tokens exceeds dec_max_len={model.cfg.dec_max_len}"
        )
    ids = torch.as_tensor([prompt + generated], dtype=torch.long, device=memory.device)
    _, maps = model.decoder(ids, model.memory_kv(memory[:1]), need_weights=True)  # L x [1, H, T, N]
    stacked = torch.stack([m[0] for m in maps], 0)  # [L, H, T, N]
    start = len(prompt) - 1
    return stacked[:, :, start : start + len(generated)].permute(2, 0, 1, 3)  # [G, L, H, N]


def patch_maps(model, memory: torch.Tensor, index, prompts, generated) -> list[torch.Tensor]:
    """Per row b: [G, L, H, grid, grid] cross-attention over the image patches (prefix tokens dropped) behind
    each of the G tokens `generated[b]` after `prompts[b]` on image `index[b]` of `memory`, on the CPU, for all
    rows in one teacher-forced pass (what `Predictor(..., return_attention=True)` returns). Rows are
    right-padded: under causal attention a real token never sees the padding after it, so each row's weights
    are those of its own pass (`cross_attention_maps`)."""
    cfg = model.cfg
    g = cfg.grid
    out = [torch.zeros(0, cfg.cross_layers, cfg.dec_heads, g, g) for _ in generated]
    rows = [b for b, seq in enumerate(generated) if seq]
    if not rows:
        return out
    seqs = [list(prompts[b]) + list(generated[b]) for b in rows]
    if max(len(q) for q in seqs) > cfg.dec_max_len:
        raise InputError(f"prompt + generated of {max(len(q) for q in seqs)} tokens exceeds "
                         f"dec_max_len={cfg.dec_max_len}")
    ids = torch.full((len(rows), max(len(q) for q in seqs)), cfg.pad_id, dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, : len(q)] = torch.as_tensor(q)
    img = torch.as_tensor([index[b] for b in rows], dtype=torch.long, device=memory.device)
    with torch.inference_mode():
        _, maps = model.decoder(ids.to(memory.device), model.memory_kv(memory, img), need_weights=True)
    stacked = torch.stack(maps, 1)  # [R, L, H, T, N]
    patches = stacked[..., stacked.shape[-1] - g * g :].float().cpu()  # drop the prefix (CLS) tokens
    for i, b in enumerate(rows):
        start = len(prompts[b]) - 1  # the query at position t wrote token t + 1
        m = patches[i, :, :, start : start + len(generated[b])]  # [L, H, G, grid^2]
        # a copy: a view would keep the whole batch's maps (every row, every prompt token) alive with each result
        out[b] = rearrange(m, "l h t (y x) -> t l h y x", y=g).clone()
    return out


__all__ = ["Generation", "METHODS", "generate", "generation_config", "answer_vocab", "score_candidates",
           "cross_attention_maps", "patch_maps"]
