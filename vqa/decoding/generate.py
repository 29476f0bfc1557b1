"""Generation: greedy, beam search (`vqa.decoding.beam`) and top-k / top-p sampling (the `METHODS`), candidate
ranking and the cross-attention maps behind generated words.

Every method decodes a batch of prompts through one `vqa.decoding.batch.BatchDecoder`: the image's keys/values
computed once, a preallocated KV cache, left-padded prompts each with its own length budget (so a padded batch
gives exactly what the prompts give one by one), each new token through the fixed-shape decode step
(`vqa.decoding.step`), eagerly or, with `compile=True`, through torch.compile (CUDA graphs on a GPU).

A decoding method is a function `(model, kv, prompts, config, **decoding) -> Generation` in `METHODS` (the
`decoding` keywords go to `BatchDecoder`); its settings are fields of `GenerationConfig` (vqa.config), which
validates them. Adding one touches these two places.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange

from ..config import GenerationConfig
from ..errors import ConfigError, InputError
from ..model import VQAModel
from .batch import BatchDecoder, Generation, ban_bias
from .beam import beam_search
from .compiled import compiled_step
from .compiled import encode as encode_images


def _check_ids(model: VQAModel, rows: list[list[int]]) -> None:
    vocab = model.cfg.vocab_size
    bad = next((t for r in rows for t in r if not 0 <= int(t) < vocab), None)
    if bad is not None:
        raise InputError(f"token id {bad} is outside the vocabulary (0..{vocab - 1}): wrong tokenizer?")


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the top_k most likely tokens and the smallest set whose probability reaches top_p; -inf the rest."""
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # the tokens after the nucleus is full
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def generation_config(config: GenerationConfig | None, changes: dict,
                      default: GenerationConfig | None = None) -> GenerationConfig:
    """`config` (None: `default`, else GenerationConfig()) with the GenerationConfig fields in `changes`; a bad
    value is an InputError (the caller's input, not the program's configuration)."""
    try:
        return (config or default or GenerationConfig()).replace(**changes)
    except ConfigError as e:
        raise InputError(str(e)) from None


@torch.inference_mode()  # returns lists only: no autograd bookkeeping at all (~10% faster than no_grad at batch 1)
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
    compile: bool = False,  # run the decode step through torch.compile (vqa.decoding.step.CompiledStep)
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
    model that is no longer trained); the result is that of the eager step."""
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
        if image_index.shape != (len(prompts),) or not 0 <= int(image_index.min()) <= int(image_index.max()) < memory.shape[0]:
            raise InputError(f"image_index must give each of the {len(prompts)} prompts one of the {memory.shape[0]} images")
    _check_ids(model, prompts)
    banned = _banned(model, banned)
    allowed = None if vocab is None else answer_vocab(model, vocab, banned)
    if allowed is not None and config.min_new_tokens > 0 and allowed.numel() == 1:
        raise InputError("the vocabulary allowed holds no token but <eos>, and min_new_tokens asks for at least "
                         f"{config.min_new_tokens}: nothing can be generated")
    kv = model.memory_kv(memory, image_index)
    decoding = dict(vocab=allowed, ban=None if allowed is not None else ban_bias(model, banned))
    if not compile:
        return METHODS[config.method](model, kv, prompts, config, **decoding)
    with compiled_step(model.decoder).lock:  # its state buffers serve one decoding at a time
        return METHODS[config.method](model, kv, prompts, config, compiled=True, **decoding)


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


def _greedy(model, kv, prompts, config: GenerationConfig, **decoding) -> Generation:
    return _greedy_or_sample(model, kv, prompts, config, sample=False, **decoding)


def _sample(model, kv, prompts, config: GenerationConfig, **decoding) -> Generation:
    return _greedy_or_sample(model, kv, prompts, config, sample=True, **decoding)


def _greedy_or_sample(model, kv, prompts, config: GenerationConfig, sample: bool, **decoding) -> Generation:
    dec = BatchDecoder(model, kv, prompts, config, **decoding)
    eos, b, n = dec.eos, len(prompts), dec.max_new
    device = dec.logits.device
    generator = None
    if sample and config.seed is not None:
        generator = torch.Generator(device=device).manual_seed(int(config.seed))
    # per step: the tokens chosen [B] and their log-probabilities; a row's tokens after its first <eos> are
    # ignored (the row is still fed, so the batch keeps its shape), so the loop does no per-row bookkeeping
    toks, lps = [], []
    spent = torch.as_tensor(dec.budget, device=device) <= torch.arange(1, n + 1, device=device)[:, None]  # [T, B]
    done = torch.zeros(b, dtype=torch.bool, device=device)  # the row produced <eos>
    logits = dec.logits
    for t in range(n):
        logp = logits.log_softmax(-1)  # [B, V]: the model's distribution, which scores the tokens chosen
        if sample:  # among the tokens allowed (`choices`: none banned, no <eos> before min_new_tokens)
            probs = filter_logits(dec.choices(logits, t) / config.temperature, config.top_k, config.top_p).softmax(-1)
            tok = torch.multinomial(probs, 1, generator=generator)[:, 0]  # [B]
        else:
            tok = dec.choices(logp, t).argmax(-1)
        lp = logp.gather(1, tok[:, None])[:, 0]
        toks.append(tok)
        lps.append(lp)
        if t == n - 1:
            break
        # every row ended or used its budget? (no row can end while <eos> is still forbidden)
        if t + 1 >= config.min_new_tokens:
            done |= tok == eos
            if bool((done | spent[t]).all()):
                break
        logits = dec.step(tok)
    tokens, logps = torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist()  # [B, T]
    sequences, scores = [], []
    for i in range(b):
        row = tokens[i][: dec.budget[i]]
        end = row.index(eos) if eos in row else len(row)  # the sequence stops before <eos> ...
        sequences.append(row[:end])
        scores.append(sum(logps[i][: min(end + 1, len(row))]))  # ... and its score counts <eos>
    return Generation(sequences=dec.ids(sequences), scores=scores)



METHODS = {"greedy": _greedy, "beam": beam_search, "sample": _sample}


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
    logp = F.log_softmax(model.decoder.logits(hidden[:, :-1]).float(), -1)  # predicts tokens 1..T-1
    tok_logp = logp.gather(-1, ids[:, 1:, None])[..., 0]  # [C, T-1]
    return (tok_logp * target[:, 1:]).sum(1)


@torch.no_grad()
def cross_attention_maps(model: VQAModel, memory: torch.Tensor, prompt: list[int], generated: list[int]) -> torch.Tensor:
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
        out[b] = rearrange(m, "l h t (y x) -> t l h y x", y=g)
    return out


__all__ = ["Generation", "METHODS", "generate", "generation_config", "answer_vocab", "filter_logits",
           "score_candidates", "cross_attention_maps", "patch_maps"]
