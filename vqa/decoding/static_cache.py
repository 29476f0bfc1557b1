"""The static KV cache and the two passes that write it: `prefill` (the prompts) and `decode_step` (one new
token per row through the decoder).

Every tensor a step touches has a fixed shape for the whole decoding: the caches are [B, H, S, Dh] for S slots,
the token's cache slot and every row's position are tensors (not Python integers that change each step), and a
key mask [B, S] says which slots hold a real key (the prompt's non-padding tokens and the tokens fed so far).
So the step is one function of tensors that `torch.compile` captures once per batch shape -- on CUDA with CUDA
graphs, which replay the whole step as one launch -- and the same function runs eagerly everywhere else: the
compiled and the eager step are one implementation (tests/test_generate_compiled.py holds them equal).

    cache = CacheBuffers.allocate(cfg, batch, slots, dtype, device)  # or CompiledStep.buffers (pooled)
    hidden = prefill(decoder, cache, ids, valid, memory_kv, padded)  # the prompts, eagerly
    logits = decode_step(decoder, head, tokens, cache.pos, cache.slot, cache.key_valid, cache.k, cache.v, kv)

The decoding methods do not call these: they run on a `vqa.decoding.decode_state.DecodeState`, whose eager
(`EagerState`) and compiled (`vqa.decoding.compiled_state.CompiledState`) implementations do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..model.masks import causal_mask


class StaticKVCache:
    """One layer's self-attention cache over fixed buffers [B, H, S, Dh]: `append` writes the new keys/values at
    `slot` (a tensor of T slot indices) and returns the buffers' first `visible` slots (None: all of them; the
    caller's key mask hides the slots not written yet). `len` is what `Attention` reads to choose plain causal
    attention: 0 (`empty`) says nothing was cached before, so with no mask the queries attend causally among
    themselves -- the prefill of prompts of one length."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor, visible: int | None = None,
                 empty: bool = False):
        self.k, self.v, self.slot, self.visible = k, v, slot, visible
        self.len = 0 if empty else visible or k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [B, H, T, Dh] into slots `slot`; in the cache's dtype (under autocast a QK-normed key comes out float32)
        self.k.index_copy_(2, self.slot, k.to(self.k.dtype))
        self.v.index_copy_(2, self.slot, v.to(self.v.dtype))
        if self.visible is not None:
            return self.k[:, :, : self.visible], self.v[:, :, : self.visible]
        return self.k, self.v


def slots_needed(prompt_width: int, max_new: int) -> int:
    """Cache slots a decoding writes: the left-padded prompts, then every generated token but the last (which
    is chosen and never fed back)."""
    return prompt_width + max(0, max_new - 1)


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
        c = cfg
        shape = (batch, c.kv_heads, slots, c.head_dim)  # grouped-query attention caches its key/value heads only
        return cls(k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.dec_depth)],
                   v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.dec_depth)],
                   key_valid=torch.zeros(batch, slots, dtype=torch.bool, device=device),
                   pos=torch.zeros(batch, dtype=torch.long, device=device),
                   slot=torch.zeros(1, dtype=torch.long, device=device))

    @property
    def batch(self) -> int:
        return self.key_valid.shape[0]

    @property
    def slots(self) -> int:
        return self.key_valid.shape[1]

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
    device = ids.device
    cache.key_valid[:, :p] = valid
    slot = torch.arange(p, device=device)
    caches = [StaticKVCache(k, v, slot, visible=p, empty=True) for k, v in zip(cache.k, cache.v, strict=True)]
    if not padded:
        hidden, _ = decoder(ids, memory_kv, pos=0, caches=caches)
        cache.pos.fill_(p - 1)
    else:
        pos = (valid.cumsum(1) - 1).clamp(min=0)  # [B, P]
        mask = causal_mask(p, p, device, valid)  # [B, 1, P, P]; a padding query sees itself only
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


__all__ = ["StaticKVCache", "CacheBuffers", "slots_needed", "prefill", "decode_step", "head_logits"]
