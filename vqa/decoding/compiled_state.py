"""`CompiledState`: the compiled implementation of `vqa.decoding.decode_state.DecodeState`, whose steps run
through the model's `vqa.decoding.compiled.CompiledStep` (torch.compile; CUDA graphs on a GPU).

torch.compile builds one graph per shape, so a compiled decoding runs at a few shapes only: its rows padded
to a power of two (`bucket`; the padding rows repeat row 0, are fed <eos> and their outputs are dropped) and
its cache as long as the request can write, in a few lengths (`slot_bucket`) that a server compiles at
start-up (`vqa.inference.warmup`). Its buffers come from the CompiledStep's pool, at the addresses a CUDA
graph was captured with: one decoding at a time per model (`CompiledStep.lock`, held through `exclusive`).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from .compiled import bucket, compiled_step
from .decode_state import rows_of
from .static_cache import head_logits, prefill, slots_needed

# the smallest cache, every preset's whole context (at most 64 positions), so all their decodings share one
# length; longer ones are powers of two
MIN_SLOTS = 64


def slot_bucket(slots: int) -> int:
    """The cache length a compiled decoding runs at for `slots` slots: MIN_SLOTS or the next power of two, so
    a few static shapes serve every request (torch.compile builds one graph per shape) while a long context
    (an imported GPT-2's 1,024 positions) is cached only as far as the request can write."""
    return max(MIN_SLOTS, bucket(slots))


def padded_index(index: torch.Tensor, batch: int) -> torch.Tensor:
    """`index` [rows] extended to [batch]: the padding rows are copies of row 0."""
    return torch.cat((index, index.new_zeros(batch - index.shape[0])))


class CompiledState:
    """`DecodeState` through the compiled step: `bucket(rows)` rows (int8: at least two, `CompiledStep.batch`), and
    the slots the decoding writes (`slots_needed`) rounded up by `slot_bucket`. Rows padded to the left share
    slots, so a short prompt's longer budget counts from the widest prompt."""

    def __init__(self, decoder: nn.Module, memory_kv: list, head: torch.Tensor | None, rows: int, width: int,
                 max_new: int):
        self.decoder, self.head, self.rows = decoder, head, rows
        self.compiled_step = compiled_step(decoder)
        k, batch = memory_kv[0][0], self.compiled_step.batch(rows)
        if batch > rows:
            memory_kv = rows_of(memory_kv, padded_index(torch.arange(rows, device=k.device), batch))
        slots = slot_bucket(slots_needed(width, max_new))
        self.cache, self.kv = self.compiled_step.buffers(batch, slots, k.dtype, k.device, memory_kv)

    @staticmethod
    def exclusive(decoder: nn.Module) -> threading.Lock:
        """The compiled step's lock: its pooled buffers, at a CUDA graph's addresses, serve one decoding at a time."""
        return compiled_step(decoder).lock

    @property
    def batch(self) -> int:
        return self.cache.batch

    @property
    def slots(self) -> int:
        return self.cache.slots

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor, padded: bool) -> torch.Tensor:
        if self.batch > self.rows:  # [rows, P] -> [batch, P]: the padding rows repeat row 0's prompt
            index = padded_index(torch.arange(self.rows, device=ids.device), self.batch)
            ids, valid = ids.index_select(0, index), valid.index_select(0, index)
        hidden = prefill(self.decoder, self.cache, ids, valid, self.kv, padded)
        return head_logits(self.decoder, self.head, hidden)[: self.rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.batch > self.rows:  # the padding rows are fed <eos>: their outputs are never read
            tokens = torch.cat((tokens, tokens.new_full((self.batch - self.rows,), self.decoder.cfg.eos_id)))
        return self.compiled_step(self.decoder, self.head, tokens, self.cache, self.kv)[: self.rows]

    def expand(self, copies: int) -> None:
        old = self.cache
        each = torch.arange(self.rows, device=old.pos.device).repeat_interleave(copies)  # [rows*copies]
        self.rows *= copies
        batch = self.compiled_step.batch(self.rows)
        index = padded_index(each, batch)  # [batch]: then copies of row 0
        self.cache, self.kv = self.compiled_step.buffers(batch, old.slots, old.k[0].dtype, old.k[0].device,
                                                         rows_of(self.kv, index))
        self.cache.copy_rows(old, index)

    def reorder(self, index: torch.Tensor) -> None:
        # the padding rows keep their places
        self.cache.reorder(torch.cat((index, torch.arange(index.shape[0], self.batch, device=index.device))))


__all__ = ["MIN_SLOTS", "slot_bucket", "CompiledState"]
