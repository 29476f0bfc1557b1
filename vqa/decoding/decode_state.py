"""`DecodeState`: the model's side of one batched decoding -- the prompts in, one token per row in, logits
out, the KV cache inside -- and `EagerState`, its eager implementation. The compiled one is
`vqa.decoding.compiled_state.CompiledState`; `BatchDecoder` picks one of the two when it is built, so the
decoding methods (greedy, sampling, beam search) run the same code either way.

    state = EagerState(decoder, memory_kv, head, rows, width, max_new)  # or CompiledState(...): the same
    logits = state.prefill(ids, valid, padded)  # ids [rows, width] -> [rows, V]
    logits = state.step(tokens)  # tokens [rows] -> [rows, V], at most max_new times
    state.expand(copies)  # beam search: each row becomes `copies` rows
    state.reorder(index)  # beam search: row i takes row index[i]'s cache
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Protocol

import torch
from torch import nn

from .static_cache import CacheBuffers, decode_step, head_logits, prefill


class DecodeState(Protocol):
    """One batched decoding's KV cache and step, for `rows` rows. An implementation is built from the decoder,
    the image keys/values, `head` (the LM head's rows [V', D] when only some tokens may follow; None: the whole
    vocabulary), the rows, the prompts' width and `max_new` (the most tokens a row may generate). Logits are
    float32 [rows, V]."""

    rows: int  # the rows the decoding method sees: the prompts, or their beams after `expand`

    @staticmethod
    def exclusive(decoder: nn.Module) -> AbstractContextManager:
        """Held around a whole decoding (built, then run): what keeps others off the buffers it shares."""
        ...

    @property
    def batch(self) -> int:
        """Rows the cache holds: `rows`, or more (compiled: padded to a power of two)."""
        ...

    @property
    def slots(self) -> int:
        """Cache slots per row."""
        ...

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor, padded: bool) -> torch.Tensor:
        """Run the left-padded prompts ids [rows, P] (valid [rows, P]: not padding; `padded`: their lengths
        differ) into the cache; the logits [rows, V] of the token after each."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token id per row [rows]; the logits [rows, V] of the next."""
        ...

    def expand(self, copies: int) -> None:
        """Repeat each row `copies` times, in place of it (row i becomes rows i*copies .. (i+1)*copies-1):
        `rows` becomes rows * copies."""
        ...

    def reorder(self, index: torch.Tensor) -> None:
        """Row i takes the cache of row index[i] (index [rows]: the parent of each surviving beam)."""
        ...


def rows_of(memory_kv: list, index: torch.Tensor) -> list:
    """Rows `index` of every layer's image keys/values ([B, H, N, Dh] each)."""
    return [(k.index_select(0, index), v.index_select(0, index)) for k, v in memory_kv]


class EagerState:
    """`DecodeState` run eagerly: buffers of exactly `rows` rows and width + max_new slots (a slot for every
    token a row may generate, the last one too), and a step that reads only the slots written so far
    (`written`), with no key mask at all when the prompts have one length."""

    def __init__(self, decoder: nn.Module, memory_kv: list, head: torch.Tensor | None, rows: int, width: int,
                 max_new: int):
        self.decoder, self.kv, self.head, self.rows = decoder, memory_kv, head, rows
        k = memory_kv[0][0]
        self.cache = CacheBuffers.allocate(decoder.cfg, rows, width + max_new, k.dtype, k.device)
        self.written = 0  # cache slots holding keys
        self.padded = True

    @staticmethod
    def exclusive(decoder: nn.Module) -> AbstractContextManager:
        """Nothing to hold: each eager decoding allocates its own buffers."""
        return contextlib.nullcontext()

    @property
    def batch(self) -> int:
        return self.cache.batch

    @property
    def slots(self) -> int:
        return self.cache.slots

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor, padded: bool) -> torch.Tensor:
        self.padded, self.written = padded, ids.shape[1]
        return head_logits(self.decoder, self.head, prefill(self.decoder, self.cache, ids, valid, self.kv, padded))

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.written += 1
        c = self.cache
        return decode_step(self.decoder, self.head, tokens, c.pos, c.slot, c.key_valid, c.k, c.v, self.kv,
                           written=self.written, padded=self.padded)

    def expand(self, copies: int) -> None:
        old = self.cache
        index = torch.arange(self.rows, device=old.pos.device).repeat_interleave(copies)  # [rows*copies]
        self.rows *= copies
        self.kv = rows_of(self.kv, index)
        self.cache = CacheBuffers.allocate(self.decoder.cfg, self.rows, old.slots, old.k[0].dtype, old.k[0].device)
        self.cache.copy_rows(old, index)

    def reorder(self, index: torch.Tensor) -> None:
        self.cache.reorder(index)


__all__ = ["DecodeState", "EagerState", "rows_of"]
