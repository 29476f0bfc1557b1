"""The decode step: one new token per row through the decoder, over preallocated self-attention caches.

Every tensor a step touches has a fixed shape for the whole decoding: the caches are [B, H, S, Dh] for S slots,
the token's cache slot and every row's position are tensors (not Python integers that change each step), and a
key mask [B, S] says which slots hold a real key (the prompt's non-padding tokens and the tokens fed so far).
So the step is one function of tensors that `torch.compile` captures once per batch shape -- on CUDA with CUDA
graphs, which replay the whole step as one launch -- and the same function runs eagerly everywhere else: the
compiled and the eager step are one implementation (tests/test_generate.py holds them equal).

    state = DecodeState.allocate(decoder, batch, slots, dtype, device)   # or from a StepPool (compiled)
    prefill(decoder, state, ids, valid, memory_kv)                      # the prompts, eagerly
    logits = decode_step(decoder, head, tokens, state.pos, state.slot, state.key_valid, state.k, state.v, kv)

`CompiledStep` holds the compiled function of one model and a pool of state buffers per batch shape, reused
from one decoding to the next: CUDA graphs need the tensors they write to live at fixed addresses.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch import nn


class StaticKVCache:
    """One layer's self-attention cache over fixed buffers [B, H, S, Dh]: `append` writes the new keys/values at
    `slot` (a tensor of T slot indices) and returns the whole buffers; the caller's key mask hides the slots not
    written yet. `len` is what `Attention` reads to choose plain causal attention (0: nothing cached, so with no
    mask the queries attend causally among themselves) -- the prefill of prompts of one length."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor, visible: int | None = None):
        self.k, self.v, self.slot = k, v, slot
        self.visible = visible  # read only the first `visible` slots (the prefill); None: all of them
        self.len = 0 if visible is not None else k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(2, self.slot, k)  # [B, H, T, Dh] into slots `slot`
        self.v.index_copy_(2, self.slot, v)
        if self.visible is not None:
            return self.k[:, :, : self.visible], self.v[:, :, : self.visible]
        return self.k, self.v


@dataclass
class DecodeState:
    """What a decoding carries from step to step, all at fixed shapes and addresses."""

    k: list[torch.Tensor]  # per layer [B, H, S, Dh]
    v: list[torch.Tensor]
    key_valid: torch.Tensor  # [B, S] bool: the slot holds a real key
    pos: torch.Tensor  # [B] long: each row's position of the last token fed (left padding does not count)
    slot: torch.Tensor  # [1] long: the cache slot of the last token fed, the same in every row

    @classmethod
    def allocate(cls, cfg, batch: int, slots: int, dtype, device) -> DecodeState:
        """Empty state for `batch` rows and `slots` cache slots of a decoder built from ModelConfig `cfg`."""
        c = cfg
        shape = (batch, c.dec_heads, slots, c.dec_width // c.dec_heads)
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

    def copy_rows(self, other: DecodeState, index: torch.Tensor) -> None:
        """Fill this state with rows `index` of `other` (beam search: each prompt's state to its beams)."""
        for mine, theirs in zip(self.tensors(), other.tensors(), strict=True):
            mine.copy_(theirs if mine is self.slot else theirs.index_select(0, index))


def prefill(decoder: nn.Module, state: DecodeState, ids: torch.Tensor, valid: torch.Tensor, memory_kv,
            padded: bool) -> torch.Tensor:
    """Run the left-padded prompts ids [B, P] (valid [B, P]: not padding) into slots 0..P-1 and return the last
    position's hidden state [B, D]. Prompts of one length (`padded` False) need no mask: plain causal attention
    (SDPA's mask-free path). Otherwise padding keys are masked and positions count real tokens only."""
    b, p = ids.shape
    device = ids.device
    state.key_valid[:, :p] = valid
    slot = torch.arange(p, device=device)
    caches = [StaticKVCache(k, v, slot, visible=p) for k, v in zip(state.k, state.v, strict=True)]
    if not padded:
        hidden, _ = decoder(ids, memory_kv, pos=0, caches=caches)
        state.pos.fill_(p - 1)
    else:
        pos = (valid.cumsum(1) - 1).clamp(min=0)  # [B, P]
        causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        eye = torch.eye(p, dtype=torch.bool, device=device)
        mask = ((causal & valid[:, None, :]) | eye)[:, None]  # [B, 1, P, P]; a padding query sees itself only
        hidden, _ = decoder(ids, memory_kv, pos=pos, mask=mask, caches=caches)
        state.pos.copy_(pos[:, -1])
    state.slot.fill_(p - 1)
    return hidden[:, -1]


def decode_step(decoder: nn.Module, head: torch.Tensor | None, tokens: torch.Tensor, pos: torch.Tensor,
                slot: torch.Tensor, key_valid: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
                memory_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Feed tokens [B] at the next slot and the next position of every row; returns logits [B, V] (float32).
    `head`: the LM head's rows [V', D] when only some tokens may follow (else the tied head over the whole
    vocabulary). Advances `slot`, `pos` and `key_valid` and writes every layer's cache, in place."""
    slot.add_(1)
    pos.add_(1).clamp_(max=decoder.cfg.dec_max_len - 1)  # a row past its own budget is still fed; its output is ignored
    key_valid.index_fill_(1, slot, True)
    caches = [StaticKVCache(k, v, slot) for k, v in zip(ks, vs, strict=True)]
    hidden, _ = decoder(tokens[:, None], memory_kv, pos=pos[:, None], mask=key_valid[:, None, None, :], caches=caches)
    h = hidden[:, 0]  # [B, D]
    return (decoder.logits(h) if head is None else h @ head.t()).float()


# freezing: the weights become constants of the compiled code (on CPU: prepacked for oneDNN / MKL, and int8 weights
# run oneDNN's int8 kernels). Inductor reads its config when it compiles a graph, which can be any call.
INDUCTOR = {"freezing": True}


class CompiledStep:
    """`decode_step` compiled for one model, with its state buffers pooled per (batch, slots): a decoding takes a
    state from the pool and gives it back, so the compiled graph (and a CUDA graph) always sees the tensors it
    was captured with. The model's weights are frozen into the compiled code (inductor's `freezing`): compile
    only a model whose weights no longer change. One decoding at a time per model (a lock)."""

    POOL = 4  # state shapes kept per model

    def __init__(self, decoder: nn.Module):
        import torch._dynamo.exc
        import torch._inductor.config
        import torch._inductor.exc  # noqa: F401 (the errors __call__ catches)

        self.cfg = decoder.cfg  # no reference to the decoder itself: the cache of these is keyed weakly by it
        self.cuda = next(decoder.parameters()).device.type == "cuda"
        options = {"triton.cudagraphs": True} if self.cuda else {}  # CUDA: the step replays as one CUDA graph
        self.fn = torch.compile(decode_step, fullgraph=True, options=options)
        self.lock = threading.Lock()
        self.failed: str | None = None  # why compiling failed (then every step runs eagerly)
        self._states: dict[tuple, tuple[DecodeState, list | None]] = {}

    def state(self, batch: int, slots: int, dtype, device, memory_kv) -> tuple[DecodeState, list]:
        """A reset state for `batch` rows and `slots` slots, and the image keys/values the steps read: on CUDA a
        pooled copy of `memory_kv` (a CUDA graph reads its inputs from fixed addresses), else `memory_kv`."""
        n = memory_kv[0][0].shape[2]
        key = (batch, slots, n, dtype, str(device))
        if key not in self._states:
            if len(self._states) >= self.POOL:
                self._states.pop(next(iter(self._states)))
            state = DecodeState.allocate(self.cfg, batch, slots, dtype, device)
            kv = None
            if self.cuda:  # CUDA graphs read and write these in place: their addresses must not change
                kv = [(torch.empty_like(k), torch.empty_like(v)) for k, v in memory_kv]
                for t in (*state.tensors(), *(x for pair in kv for x in pair)):
                    torch._dynamo.mark_static_address(t)
            self._states[key] = (state, kv)
        state, kv = self._states[key]
        state.reset()
        if kv is None:
            return state, memory_kv
        for (k, v), (k_new, v_new) in zip(kv, memory_kv, strict=True):
            k.copy_(k_new)
            v.copy_(v_new)
        return state, kv

    def __call__(self, decoder, head, tokens, state: DecodeState, memory_kv) -> torch.Tensor:
        args = (decoder, head, tokens, state.pos, state.slot, state.key_valid, state.k, state.v, memory_kv)
        if self.failed is None:
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            try:
                with torch._inductor.config.patch(INDUCTOR):
                    logits = self.fn(*args)
                return logits.clone() if self.cuda else logits  # a CUDA graph's output is overwritten by its next replay
            except (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.InductorError) as e:
                # compiling happens before the step runs: nothing was written yet, the eager step can take over
                self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                warnings.warn(f"the compiled decode step could not be built ({self.failed}); decoding eagerly",
                              RuntimeWarning, stacklevel=2)
        return decode_step(*args)


_compiled: weakref.WeakKeyDictionary[nn.Module, CompiledStep] = weakref.WeakKeyDictionary()
_compiled_lock = threading.Lock()


def compiled_step(decoder: nn.Module) -> CompiledStep:
    """The CompiledStep of `decoder`, made on first use (compilation itself happens on the first step of each
    new batch shape; torch.compile recompiles with a dynamic batch size after the first change)."""
    with _compiled_lock:
        step = _compiled.get(decoder)
        if step is None:
            step = _compiled[decoder] = CompiledStep(decoder)
        return step


__all__ = ["StaticKVCache", "DecodeState", "prefill", "decode_step", "CompiledStep", "compiled_step"]
