"""One batched decoding, `DecodingBatch`: what the decoding methods (`vqa.config.decoding_methods`) run on, its
static KV cache and the step that writes it, and what the methods return (`Generation`).

The image is encoded once and each layer's cross-attention keys/values are computed once per image; the
self-attention keeps a preallocated cache, so every new token costs the same whatever its position. Prompts of
different lengths are left-padded: position ids count real tokens only and padding keys are masked, and each
prompt has its own length budget (the context left after *its* prompt), so a padded batch gives exactly what
the prompts give one by one.

Every tensor a step touches has a fixed shape for the whole decoding: the caches are [B, H, S, Dh] for S slots,
the token's slot and every row's position are tensors, and a key mask [B, S] says which slots hold a real key.
So `decode_step` is one function of tensors that torch.compile captures once per batch shape (`compiled_step`;
on CUDA as a CUDA graph), and the same function runs eagerly: one implementation (tests/test_generate_compiled.py
holds them equal). Compiled, a decoding runs at a few shapes only: its rows padded to a power of two (the padding
rows repeat row 0, are fed <eos> and their outputs are dropped) and its cache in a few lengths (`slot_bucket`),
in buffers pooled by the compiled step.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import GenerationConfig
from ..errors import InputError
from ..model import VQAModel
from ..model.attention import StaticKVCache
from ..model.masks import causal_mask
from .compiled import CompiledStep, bucket, step_of


@dataclass
class Generation:
    sequences: list[list[int]]  # per prompt: the generated ids, without the prompt and the final <eos>
    scores: list[float]  # per prompt: total log-probability of the sequence (incl. <eos>) under the model
    beams: list[list[tuple[list[int], float]]] = field(default_factory=list)  # per prompt: every kept hypothesis


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, P] of the prompts padded on the left with `pad_id`, and valid [B, P]: True on their own tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        valid[i, width - len(p) :] = True
    return ids.to(device), valid.to(device)


_biases: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> {(ids, device): bias}
_biases_lock = threading.Lock()


def ban_bias(model: VQAModel, banned: frozenset[int]) -> torch.Tensor | None:
    """[V] float32 on the model's device: 0, and -inf on the `banned` token ids (None when none is banned).
    Built once per model and set of ids (a tokenizer's `never_generated`) and kept: every decoding of that
    model reuses the same tensor."""
    if not banned:
        return None
    weight = model.decoder.embed.weight
    key = (tuple(sorted(banned)), str(weight.device))
    with _biases_lock:
        per_model = _biases.setdefault(model.decoder, {})
        bias = per_model.get(key)
        if bias is None:
            bias = torch.zeros(model.cfg.vocab_size, dtype=torch.float32, device=weight.device)
            bias[list(key[0])] = float("-inf")
            per_model[key] = bias
        return bias


# the smallest compiled cache, every preset's whole context (at most 64 positions), so all their decodings share
# one length; longer ones are powers of two
MIN_SLOTS = 64


def slots_needed(prompt_width: int, max_new: int) -> int:
    """Cache slots a decoding writes: the left-padded prompts, then every generated token but the last (which
    is chosen and never fed back)."""
    return prompt_width + max(0, max_new - 1)


def slot_bucket(slots: int) -> int:
    """The cache length a compiled decoding runs at for `slots` slots: MIN_SLOTS or the next power of two, so
    a few static shapes serve every request (torch.compile builds one graph per shape) while a long context
    (an imported GPT-2's 1,024 positions) is cached only as far as the request can write."""
    return max(MIN_SLOTS, bucket(slots))


@dataclass
class CacheBuffers:
    """What a decoding carries from step to step, all at fixed shapes and addresses: every layer's
    self-attention cache, which slots hold keys, and where each row is."""

    k: list[torch.Tensor]  # per layer [B, H, S, Dh]
    v: list[torch.Tensor]
    key_valid: torch.Tensor  # [B, S] bool: the slot holds a real key
    pos: torch.Tensor  # [B] long: each row's position of the last token fed (left padding does not count)
    slot: torch.Tensor  # [1] long: the cache slot of the last token fed, the same in every row

    @classmethod
    def allocate(cls, cfg, batch: int, slots: int, dtype, device) -> CacheBuffers:
        """Empty buffers for `batch` rows and `slots` cache slots of a decoder built from ModelConfig `cfg`."""
        shape = (batch, cfg.kv_heads, slots, cfg.head_dim)  # grouped-query attention caches its key/value heads
        return cls(k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.dec_depth)],
                   v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.dec_depth)],
                   key_valid=torch.zeros(batch, slots, dtype=torch.bool, device=device),
                   pos=torch.zeros(batch, dtype=torch.long, device=device),
                   slot=torch.zeros(1, dtype=torch.long, device=device))

    @property
    def batch(self) -> int:
        return self.key_valid.shape[0]

    @property
    def slots(self) -> int:
        return self.key_valid.shape[1]

    def empty(self, batch: int) -> CacheBuffers:
        """New empty buffers of these shapes for `batch` rows."""
        zeros = lambda t: t.new_zeros((batch, *t.shape[1:]))  # noqa: E731
        return CacheBuffers([zeros(k) for k in self.k], [zeros(v) for v in self.v], zeros(self.key_valid),
                            zeros(self.pos), self.slot.new_zeros(1))

    def tensors(self) -> list[torch.Tensor]:
        return [*self.k, *self.v, self.key_valid, self.pos, self.slot]

    def reset(self) -> None:
        """Empty, for the next decoding (the caches need no clearing: a slot is read only once written)."""
        self.key_valid.zero_()
        self.pos.zero_()
        self.slot.zero_()

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows `index` (beam search: each surviving beam takes its parent's cache), in place."""
        for t in (*self.k, *self.v, self.key_valid, self.pos):
            t.copy_(t.index_select(0, index))

    def copy_rows(self, other: CacheBuffers, index: torch.Tensor) -> None:
        """Fill these buffers with rows `index` of `other` (beam search: each prompt's state to its beams)."""
        for mine, theirs in zip(self.tensors(), other.tensors(), strict=True):
            mine.copy_(theirs if mine is self.slot else theirs.index_select(0, index))


def prefill(decoder: nn.Module, cache: CacheBuffers, ids: torch.Tensor, valid: torch.Tensor, memory_kv,
            padded: bool) -> torch.Tensor:
    """Run the left-padded prompts ids [B, P] (valid [B, P]: not padding) into slots 0..P-1 and return the last
    position's hidden state [B, D]. Prompts of one length (`padded` False) need no mask: plain causal attention
    (SDPA's mask-free path). Otherwise padding keys are masked and positions count real tokens only."""
    b, p = ids.shape
    cache.key_valid[:, :p] = valid
    slot = torch.arange(p, device=ids.device)
    caches = [StaticKVCache(k, v, slot, visible=p, empty=True) for k, v in zip(cache.k, cache.v, strict=True)]
    if not padded:
        hidden, _ = decoder(ids, memory_kv, pos=0, caches=caches)
        cache.pos.fill_(p - 1)
    else:
        pos = (valid.cumsum(1) - 1).clamp(min=0)  # [B, P]
        mask = causal_mask(p, p, ids.device, valid)  # [B, 1, P, P]; a padding query sees itself only
        hidden, _ = decoder(ids, memory_kv, pos=pos, mask=mask, caches=caches)
        cache.pos.copy_(pos[:, -1])
    cache.slot.fill_(p - 1)
    return hidden[:, -1]


def decode_step(decoder: nn.Module, head: torch.Tensor | None, tokens: torch.Tensor, pos: torch.Tensor,
                slot: torch.Tensor, key_valid: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
                memory_kv: list[tuple[torch.Tensor, torch.Tensor]], written: int | None = None,
                padded: bool = True) -> torch.Tensor:
    """Feed tokens [B] at the next slot and the next position of every row; returns logits [B, V] (float32).
    `head`: the LM head's rows [V', D] when only some tokens may follow (else the tied head over the whole
    vocabulary). Advances `slot`, `pos` and `key_valid` and writes every layer's cache, in place.

    Compiled, every slot is read under the key mask (fixed shapes). Eagerly the caller may say how many slots
    hold keys after this step (`written`): the attention then reads only those, and prompts of one length
    (`padded` False) need no key mask at all (SDPA's mask-free kernel) -- fewer operations per token."""
    slot.add_(1)
    pos.add_(1).clamp_(max=decoder.cfg.dec_max_len - 1)  # a row past its own budget is still fed; its output is ignored
    key_valid.index_fill_(1, slot, True)
    caches = [StaticKVCache(k, v, slot, visible=written) for k, v in zip(ks, vs, strict=True)]
    mask = None if written is not None and not padded else key_valid[:, None, None, :written]  # [B, 1, 1, S]
    hidden, _ = decoder(tokens[:, None], memory_kv, pos=pos[:, None], mask=mask, caches=caches)
    return head_logits(decoder, head, hidden[:, 0])


def head_logits(decoder: nn.Module, head: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits [B, V] of hidden states [B, D]: the decoder's LM head, or only its rows `head` [V', D]."""
    return (decoder.logits(hidden) if head is None else hidden @ head.t()).float()


def compiled_step(decoder: nn.Module) -> CompiledStep:
    """`decode_step` compiled for `decoder`, with its pooled buffers (`vqa.decoding.compiled.CompiledStep`; its
    `lock` keeps a compiled decoding's buffers to itself), made on first use."""
    return step_of(decoder, decode_step, CacheBuffers.allocate)


def rows_of(memory_kv: list, index: torch.Tensor) -> list:
    """Rows `index` of every layer's image keys/values ([B, H, N, Dh] each)."""
    return [(k.index_select(0, index), v.index_select(0, index)) for k, v in memory_kv]


class DecodingBatch:
    """The state of one batch of `rows` rows decoded together, as the decoding methods see it: the prompts run
    into the cache (`logits` [rows, V] then holds what may follow each), then one token per row per `step`; beam
    search also `expand`s and `reorder`s the rows. `budget[b]` is how many tokens row b may generate: the config's
    max_new_tokens, capped by the context left after row b's own prompt.

    With `vocab` (token ids, <eos> among them) only those tokens may follow: the LM head is computed for them
    alone, logits are [rows, len(vocab)] and the methods work on indices into `vocab` (`eos` is <eos>'s index);
    `ids()` maps them back. `ban` [V] (`ban_bias`; without a vocab) is -inf on the tokens never generated:
    `choices` adds it where the methods choose. `compiled`: each step through `compiled_step` (the cache then
    holds `compiled_step.batch(rows)` rows and `slot_bucket` slots); eagerly the cache holds exactly `rows` rows
    and a slot for every token a row may generate, and a step reads only the slots written so far. The same
    results either way."""

    def __init__(self, model: VQAModel, kv, prompts: list[list[int]], config: GenerationConfig,
                 vocab: torch.Tensor | None = None, compiled: bool = False, ban: torch.Tensor | None = None):
        limit = model.cfg.dec_max_len
        longest = max(len(q) for q in prompts)
        if longest >= limit:
            raise InputError(f"prompt of {longest} tokens leaves no room to generate (dec_max_len={limit})")
        self.budget = [config.budget(limit - len(q)) for q in prompts]
        self.max_new = max(self.budget)
        self.lm, self.rows, self.vocab, self.head, self.eos = model.decoder, len(prompts), None, None, model.cfg.eos_id
        self.ban = None if vocab is not None else ban  # a vocab leaves the banned tokens out instead
        self.min_new = config.min_new_tokens
        # streaming (`generate(watch=)`): called at every step with each prompt's tokens so far (ids)
        self.watch: Callable[[list[list[int]]], None] | None = None
        device = kv[0][0].device
        if vocab is not None:
            self.vocab = vocab.to(device)
            self.vocab_list = self.vocab.tolist()
            self.eos = self.vocab_list.index(model.cfg.eos_id)
            self.head = model.decoder.head_weight.index_select(0, self.vocab)  # [V', D]: the head's rows
        self.compiled_step = compiled_step(model.decoder) if compiled else None
        slots = slot_bucket(slots_needed(longest, self.max_new)) if compiled else longest + self.max_new
        ids, valid = left_pad(prompts, model.cfg.pad_id, device)
        index = self.padded_rows(torch.arange(self.rows, device=device))
        if len(index) > self.rows:  # the padding rows repeat row 0's prompt
            kv, ids, valid = rows_of(kv, index), ids.index_select(0, index), valid.index_select(0, index)
        if compiled:
            self.cache, self.kv = self.compiled_step.buffers(len(index), slots, kv[0][0].dtype, device, kv)
        else:
            self.cache, self.kv = CacheBuffers.allocate(model.cfg, self.rows, slots, kv[0][0].dtype, device), kv
        self.padded, self.written = len({len(q) for q in prompts}) > 1, longest  # written: cache slots holding keys
        hidden = prefill(self.lm, self.cache, ids, valid, self.kv, self.padded)
        self.logits = head_logits(self.lm, self.head, hidden)[: self.rows]  # [rows, V]

    def padded_rows(self, index: torch.Tensor) -> torch.Tensor:
        """`index` [n] extended to the rows the cache holds for n rows (compiled: more, copies of row 0)."""
        batch = len(index) if self.compiled_step is None else self.compiled_step.batch(len(index))
        return torch.cat((index, index.new_zeros(batch - len(index)))) if batch > len(index) else index

    def choices(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """`x` [B, V] (step t's logits or log-probabilities) with -inf on the tokens that may not come next:
        the banned ones, and <eos> before min_new_tokens. A new tensor: `x`, the model's own distribution,
        still scores what is chosen (as Hugging Face's logits processors act after the log-softmax in beam
        search), so a score is the model's log-probability of the output."""
        if self.ban is not None:
            x = x + self.ban
        elif t < self.min_new:
            x = x.clone()
        if t < self.min_new:
            x[:, self.eos] = float("-inf")
        return x

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [rows] (indices into `vocab` when there is one); returns the next logits."""
        tokens, c = tokens if self.vocab is None else self.vocab[tokens], self.cache
        if self.compiled_step is None:
            self.written += 1
            self.logits = decode_step(self.lm, self.head, tokens, c.pos, c.slot, c.key_valid, c.k, c.v, self.kv,
                                      written=self.written, padded=self.padded)
        else:
            if c.batch > self.rows:  # the padding rows are fed <eos>: their outputs are never read
                tokens = torch.cat((tokens, tokens.new_full((c.batch - self.rows,), self.lm.cfg.eos_id)))
            self.logits = self.compiled_step(self.lm, self.head, tokens, c, self.kv)[: self.rows]
        return self.logits

    def ids(self, rows: list[list[int]]) -> list[list[int]]:
        """Token ids of rows of `vocab` indices (unchanged without a vocab)."""
        return rows if self.vocab is None else [[self.vocab_list[i] for i in r] for r in rows]

    def expand(self, copies: int) -> None:
        """Repeat each row `copies` times (beam search: the prompt ran once, its beams continue from it): row i
        becomes rows i*copies .. (i+1)*copies-1, and `rows` becomes rows * copies."""
        old = self.cache
        index = self.padded_rows(torch.arange(self.rows, device=old.pos.device).repeat_interleave(copies))
        self.rows *= copies
        kv = rows_of(self.kv, index)
        if self.compiled_step is None:
            self.cache, self.kv = old.empty(len(index)), kv
        else:  # on CUDA the image keys/values are copied to the pooled addresses a CUDA graph reads
            self.cache, self.kv = self.compiled_step.buffers(len(index), old.slots, old.k[0].dtype, old.pos.device, kv)
        self.cache.copy_rows(old, index)
        self.logits = self.logits.repeat_interleave(copies, 0)  # [rows, V]

    def reorder(self, index: torch.Tensor) -> None:
        """Row i takes row index[i]'s cache (beam search: each beam its parent's). The parents are beams of the
        same prompt, so the image's keys/values, the same in all of them, stay."""
        rows = index
        if self.cache.batch > self.rows:  # the padding rows keep their places
            rows = torch.cat((index, torch.arange(self.rows, self.cache.batch, device=index.device)))
        self.cache.reorder(rows)
        self.logits = self.logits.index_select(0, index)


__all__ = ["Generation", "DecodingBatch", "CacheBuffers", "MIN_SLOTS", "ban_bias", "compiled_step", "decode_step",
           "head_logits", "left_pad", "prefill", "rows_of", "slot_bucket", "slots_needed"]
