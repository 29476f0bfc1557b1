"""Generation: greedy, beam search and top-k / top-p sampling (the `METHODS`), candidate ranking and the
cross-attention maps behind generated words.

The image is encoded once and each layer's cross-attention keys/values are computed once per image; the
self-attention keeps a preallocated KV cache, so every new token costs the same whatever its position.
Prompts of different lengths are left-padded: position ids count real tokens only and padding keys are
masked, and each prompt has its own length budget (the context left after *its* prompt), so a padded batch
gives exactly what the prompts give one by one. Each new token goes through `vqa.decoding.step.decode_step`, a
step of fixed shapes that runs eagerly or, with `compile=True`, through torch.compile (CUDA graphs on a GPU).

A decoding method is a function `(model, kv, prompts, config, **decoding) -> Generation` in `METHODS` (the
`decoding` keywords go to `_Decoder`); its settings are fields of `GenerationConfig` (vqa.config), which
validates them. Adding one touches these two places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..config import GenerationConfig
from ..errors import ConfigError, InputError
from ..model import VQAModel
from .compiled import bucket, compiled_step
from .compiled import encode as encode_images
from .step import DecodeState, decode_step, prefill


@dataclass
class Generation:
    sequences: list[list[int]]  # per prompt: the generated ids, without the prompt and the final <eos>
    scores: list[float]  # per prompt: total log-probability of the sequence (incl. <eos>) under the model
    beams: list[list[tuple[list[int], float]]] = field(default_factory=list)  # per prompt: every kept hypothesis


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        valid[i, width - len(p) :] = True
    return ids.to(device), valid.to(device)


SLOT_MULTIPLE = 32  # compiled: cache slots are padded up to a multiple of this (and rows to a `bucket`)


class _Decoder:
    """The state of one batched decoding of B rows: the prompts run into preallocated caches, then one token per
    row per `step` (`vqa.decoding.step`: the same step eagerly or compiled). `budget[b]` is how many tokens row b
    may generate: the config's max_new_tokens, capped by the context left after row b's own prompt.

    With `vocab` (token ids, <eos> among them) only those tokens may follow: the LM head is computed for them
    alone, logits are [B, len(vocab)] and the methods work on indices into `vocab` (`eos` is <eos>'s index);
    `ids()` maps them back. Compiled, the state holds more rows than the B the methods see (`bucket`): the
    extra rows repeat row 0 and their outputs are dropped."""

    def __init__(self, model: VQAModel, kv, prompts: list[list[int]], config: GenerationConfig,
                 vocab: torch.Tensor | None = None, compiled: bool = False):
        self.model, self.kv = model, kv
        decoder = model.decoder
        device, dtype = kv[0][0].device, kv[0][0].dtype
        limit = model.cfg.dec_max_len
        longest = max(len(q) for q in prompts)
        if longest >= limit:
            raise InputError(f"prompt of {longest} tokens leaves no room to generate (dec_max_len={limit})")
        self.budget = [config.budget(limit - len(q)) for q in prompts]
        self.max_new = max(self.budget)
        self.vocab, self.head, self.eos = None, None, model.cfg.eos_id
        if vocab is not None:
            self.vocab = vocab.to(device)
            self.vocab_list = self.vocab.tolist()
            self.eos = self.vocab_list.index(model.cfg.eos_id)
            self.head = decoder.embed.weight.index_select(0, self.vocab)  # [V', D]: the tied head's rows
        self.padded = len({len(q) for q in prompts}) > 1
        self.rows = len(prompts)
        self.compiled = compiled_step(decoder) if compiled else None
        if self.compiled is not None:
            fill = bucket(self.rows) - self.rows
            prompts = list(prompts) + [prompts[0]] * fill
            self.kv = kv = self._pad_rows(kv, self.rows, fill)
            width = max(len(q) for q in prompts)
            slots = -(-(width + self.max_new) // SLOT_MULTIPLE) * SLOT_MULTIPLE
            self.state, self.kv = self.compiled.state(len(prompts), slots, dtype, device, kv)
        ids, valid = _left_pad(prompts, model.cfg.pad_id, device)
        b, p = ids.shape
        if self.compiled is None:
            self.state = DecodeState.allocate(model.cfg, b, p + self.max_new, dtype, device)
        self.written = p  # cache slots holding keys
        hidden = prefill(decoder, self.state, ids, valid, self.kv, self.padded)
        self.logits = self._head(hidden)[: self.rows]  # [B, V]

    @staticmethod
    def _pad_rows(kv, rows: int, fill: int):
        """kv with `fill` more rows, copies of row 0."""
        if fill == 0:
            return kv
        index = torch.zeros(rows + fill, dtype=torch.long, device=kv[0][0].device)
        index[:rows] = torch.arange(rows, device=index.device)
        return [(k.index_select(0, index), v.index_select(0, index)) for k, v in kv]

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return (self.model.decoder.logits(hidden) if self.head is None else hidden @ self.head.t()).float()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [B] (indices into `vocab` when there is one); returns the next logits [B, V]."""
        if self.vocab is not None:
            tokens = self.vocab[tokens]
        s, decoder = self.state, self.model.decoder
        self.written += 1
        if self.compiled is not None:
            if s.batch > self.rows:  # the padding rows are fed <eos>: their outputs are never read
                tokens = torch.cat((tokens, tokens.new_full((s.batch - self.rows,), self.model.cfg.eos_id)))
            self.logits = self.compiled(decoder, self.head, tokens, s, self.kv)[: self.rows]
        else:
            self.logits = decode_step(decoder, self.head, tokens, s.pos, s.slot, s.key_valid, s.k, s.v, self.kv,
                                      written=self.written, padded=self.padded)
        return self.logits

    def ids(self, rows: list[list[int]]) -> list[list[int]]:
        """Token ids of rows of `vocab` indices (unchanged without a vocab)."""
        return rows if self.vocab is None else [[self.vocab_list[i] for i in r] for r in rows]

    def _full(self, index: torch.Tensor) -> torch.Tensor:
        """A row index over the B rows, extended over the state's padding rows (which keep their places)."""
        extra = self.state.batch - index.shape[0]
        if extra <= 0:
            return index
        return torch.cat((index, torch.arange(index.shape[0], self.state.batch, device=index.device)))

    def expand(self, k: int) -> None:
        """Give each row k copies (beam search: the prompt ran once, its beams continue from it)."""
        old, rows = self.state, self.rows * k
        index = torch.arange(self.rows, device=old.pos.device).repeat_interleave(k)  # [B*K]
        self.rows = rows
        dtype, device = old.k[0].dtype, old.k[0].device
        if self.compiled is not None:
            fill = bucket(rows) - rows
            index = torch.cat((index, index.new_zeros(fill)))  # padding rows: copies of row 0
            kv = [(key.index_select(0, index), value.index_select(0, index)) for key, value in self.kv]
            self.state, self.kv = self.compiled.state(rows + fill, old.slots, dtype, device, kv)
        else:
            self.kv = [(key.index_select(0, index), value.index_select(0, index)) for key, value in self.kv]
            self.state = DecodeState.allocate(self.model.cfg, rows, old.slots, dtype, device)
        self.state.copy_rows(old, index)
        self.logits = self.logits.index_select(0, index[:rows])

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows `index` (beam search: each beam takes its parent's cache). The parents are beams of the same
        prompt, so the image's keys/values, the same in all of them, stay."""
        self.state.reorder(self._full(index))
        self.logits = self.logits.index_select(0, index)


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


def _config(config: GenerationConfig | None, changes: dict) -> GenerationConfig:
    try:
        return (config or GenerationConfig()).replace(**changes) if changes else (config or GenerationConfig())
    except ConfigError as e:
        raise InputError(str(e)) from None


@torch.inference_mode()  # returns lists only: no autograd bookkeeping at all (docs/performance.md: faster than no_grad)
def generate(
    model: VQAModel,
    prompts: list[list[int]],
    images: torch.Tensor | None = None,  # [M, 3, S, S]
    *,
    memory: torch.Tensor | None = None,  # or the encoded images [M, N, D], to reuse an encoding
    image_index: torch.Tensor | list[int] | None = None,  # [B] prompt -> image; default prompt b -> image b
    config: GenerationConfig | None = None,
    vocab: Sequence[int] | torch.Tensor | None = None,  # only these token ids may be generated (and <eos>)
    compile: bool = False,  # run the decode step through torch.compile (vqa.decoding.step.CompiledStep)
    **changes,  # GenerationConfig fields, over `config` (e.g. method="beam", num_beams=3)
) -> Generation:
    """Decode a continuation of every prompt until <eos> or its length budget, by `config.method`.

    `vocab` restricts what may follow to those tokens (a VQA model's answer vocabulary, say): the LM head is
    computed for them alone, and probabilities and scores are renormalized over them (the model's distribution
    given that the output stays in the vocabulary). `compile` compiles the decode step (its weights frozen in:
    for a model that is no longer trained); the result is that of the eager step."""
    config = _config(config, changes)
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
    allowed = None if vocab is None else answer_vocab(model, vocab)
    kv = model.memory_kv(memory, image_index)
    if not compile:
        return METHODS[config.method](model, kv, prompts, config, vocab=allowed)
    with compiled_step(model.decoder).lock:  # its state buffers serve one decoding at a time
        return METHODS[config.method](model, kv, prompts, config, vocab=allowed, compiled=True)


def answer_vocab(model: VQAModel, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The sorted, distinct token ids of `ids` and <eos> (every output must be able to end), as a tensor on the
    model's device; raises InputError for ids outside the vocabulary."""
    ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
    _check_ids(model, [ids])
    device = model.decoder.embed.weight.device
    return torch.as_tensor(sorted({int(i) for i in ids} | {model.cfg.eos_id}), dtype=torch.long, device=device)


def _greedy(model, kv, prompts, config: GenerationConfig, **decoding) -> Generation:
    return _greedy_or_sample(model, kv, prompts, config, sample=False, **decoding)


def _sample(model, kv, prompts, config: GenerationConfig, **decoding) -> Generation:
    return _greedy_or_sample(model, kv, prompts, config, sample=True, **decoding)


def _greedy_or_sample(model, kv, prompts, config: GenerationConfig, sample: bool, **decoding) -> Generation:
    dec = _Decoder(model, kv, prompts, config, **decoding)
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
        if t < config.min_new_tokens:
            logits[:, eos] = float("-inf")
        logp = logits.log_softmax(-1)  # [B, V]
        if sample:
            probs = filter_logits(logits / config.temperature, config.top_k, config.top_p).softmax(-1)
            tok = torch.multinomial(probs, 1, generator=generator)  # [B, 1]
            lp, tok = logp.gather(1, tok)[:, 0], tok[:, 0]
        else:
            lp, tok = logp.max(-1)
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


def _beam_search(model, kv, prompts, config: GenerationConfig, **decoding) -> Generation:
    """Beam search with k = num_beams beams per prompt. A hypothesis ends at <eos> (only <eos> among the top
    k candidates counts, as in Hugging Face's BeamSearchScorer); its score is the total log-probability
    divided by (generated length incl. <eos>) ** length_penalty. A prompt is done once it has k ended
    hypotheses and no live beam can still beat the worst of them: log-probabilities only fall as tokens are
    added, so a live beam's best final score is its score so far divided by its longest possible length **
    length_penalty when length_penalty > 0, by its shortest (one more token) otherwise -- a true bound, so
    the search returns what running every beam to its budget would (Hugging Face's early_stopping="never").
    With `early_stopping` a prompt is done as soon as it has k ended hypotheses. Beams still alive at the
    prompt's budget are ended there. One beam is greedy decoding at length_penalty 0 (exact bound) or with
    early_stopping; at length_penalty > 0 the exact search may find a longer hypothesis that greedy's
    first <eos> cut off, scoring higher per token."""
    k, lp = config.num_beams, config.length_penalty
    b = len(prompts)
    dec = _Decoder(model, kv, prompts, config, **decoding)  # the prompt is run once per prompt, not per beam
    eos, device = dec.eos, dec.logits.device
    if k > 1:
        dec.expand(k)  # [B*K] rows, the beams of a prompt share its image
    beam_score = torch.full((b, k), float("-inf"), device=device)
    beam_score[:, 0] = 0.0  # all beams start identical: only one may expand at first
    seqs = torch.zeros(b * k, 0, dtype=torch.long, device=device)
    ended: list[list[tuple[float, list[int], float]]] = [[] for _ in range(b)]
    done = [False] * b
    logits = dec.logits
    for t in range(dec.max_new):
        if t < config.min_new_tokens:
            logits[:, eos] = float("-inf")
        vocab = logits.shape[-1]
        cand = (beam_score.view(-1, 1) + logits.log_softmax(-1)).view(b, k * vocab)  # [B, K*V]
        top_score, top_idx = cand.topk(2 * k, dim=1)  # [B, 2K]: enough that k continue even if k end
        src, tok = top_idx // vocab, top_idx % vocab
        new_score = torch.full((b, k), float("-inf"), device=device)
        new_src = torch.zeros(b, k, dtype=torch.long, device=device)
        new_tok = torch.full((b, k), eos, dtype=torch.long, device=device)
        ts, tsrc, ttok = top_score.tolist(), src.tolist(), tok.tolist()
        seq_list = seqs.tolist()
        out_of_room = []
        for i in range(b):
            if done[i]:
                continue
            j = 0
            for rank in range(2 * k):
                s, parent, w = ts[i][rank], tsrc[i][rank], ttok[i][rank]
                if w == eos:
                    if rank < k:
                        ended[i].append((s / (t + 1) ** lp, seq_list[i * k + parent], s))
                else:
                    new_score[i, j], new_src[i, j], new_tok[i, j] = s, parent, w
                    j += 1
                if j == k:
                    break
            if t + 1 >= dec.budget[i]:  # out of room: the live beams end here
                out_of_room.append(i)
                done[i] = True
            elif len(ended[i]) >= k:
                ended[i] = sorted(ended[i], key=lambda h: -h[0])[:k]
                best_live = float(new_score[i, 0])
                length = dec.budget[i] if lp > 0 else t + 2  # the length that flatters a live beam most
                done[i] = config.early_stopping or j == 0 or ended[i][-1][0] >= best_live / length**lp
        if out_of_room:
            flat = (torch.arange(b, device=device)[:, None] * k + new_src).view(-1)
            last = torch.cat([seqs.index_select(0, flat), new_tok.view(-1, 1)], 1).tolist()
            for i in out_of_room:
                for j in range(k):
                    s = float(new_score[i, j])
                    if s > float("-inf"):
                        ended[i].append((s / (t + 1) ** lp, last[i * k + j], s))
        if all(done):
            break
        flat = (torch.arange(b, device=device)[:, None] * k + new_src).view(-1)  # [B*K] parent rows
        seqs = torch.cat([seqs.index_select(0, flat), new_tok.view(-1, 1)], 1)
        beam_score = new_score
        dec.reorder(flat)
        logits = dec.step(new_tok.view(-1))
    beams = [[(dec.ids([seq])[0], raw) for _, seq, raw in sorted(e, key=lambda h: -h[0])[:k]] for e in ended]
    return Generation(sequences=[h[0][0] for h in beams], scores=[h[0][1] for h in beams], beams=beams)


METHODS = {"greedy": _greedy, "beam": _beam_search, "sample": _sample}


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


__all__ = ["Generation", "METHODS", "generate", "answer_vocab", "filter_logits", "score_candidates", "cross_attention_maps"]
