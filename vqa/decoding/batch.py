"""One batched decoding (`BatchDecoder`), what the decoding methods (`vqa.config.decoding_methods`) run on,
and what they return (`Generation`).

The image is encoded once and each layer's cross-attention keys/values are computed once per image; the
self-attention keeps a preallocated KV cache, so every new token costs the same whatever its position.
Prompts of different lengths are left-padded: position ids count real tokens only and padding keys are
masked, and each prompt has its own length budget (the context left after *its* prompt), so a padded batch
gives exactly what the prompts give one by one. The cache and the step are a `DecodeState`
(`vqa.decoding.decode_state`), eager or compiled, chosen when the BatchDecoder is built.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import GenerationConfig
from ..errors import InputError
from ..model import VQAModel
from .compiled_state import CompiledState
from .decode_state import DecodeState, EagerState


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


def decode_state(compiled: bool) -> type[DecodeState]:
    """The one place the implementation is chosen: `CompiledState` or `EagerState` (the same results)."""
    return CompiledState if compiled else EagerState


class BatchDecoder:
    """One batched decoding of B rows, as the decoding methods see it: the prompts run into the cache (`logits`
    [B, V] then holds what may follow each), then one token per row per `step`. `budget[b]` is how many tokens
    row b may generate: the config's max_new_tokens, capped by the context left after row b's own prompt.

    With `vocab` (token ids, <eos> among them) only those tokens may follow: the LM head is computed for them
    alone, logits are [B, len(vocab)] and the methods work on indices into `vocab` (`eos` is <eos>'s index);
    `ids()` maps them back. `ban` [V] (`ban_bias`; without a vocab) is -inf on the tokens never generated:
    `choices` adds it where the methods choose. `compiled` picks the `DecodeState` (`state`): `CompiledState`
    or `EagerState`, the same results."""

    def __init__(self, model: VQAModel, kv, prompts: list[list[int]], config: GenerationConfig,
                 vocab: torch.Tensor | None = None, compiled: bool = False, ban: torch.Tensor | None = None):
        limit = model.cfg.dec_max_len
        longest = max(len(q) for q in prompts)
        if longest >= limit:
            raise InputError(f"prompt of {longest} tokens leaves no room to generate (dec_max_len={limit})")
        self.budget = [config.budget(limit - len(q)) for q in prompts]
        self.max_new = max(self.budget)
        self.vocab, head, self.eos = None, None, model.cfg.eos_id
        self.ban = None if vocab is not None else ban  # a vocab leaves the banned tokens out instead
        self.min_new = config.min_new_tokens
        # streaming (`generate(watch=)`): called at every step with each prompt's tokens so far (ids)
        self.watch: Callable[[list[list[int]]], None] | None = None
        device = kv[0][0].device
        if vocab is not None:
            self.vocab = vocab.to(device)
            self.vocab_list = self.vocab.tolist()
            self.eos = self.vocab_list.index(model.cfg.eos_id)
            head = model.decoder.head_weight.index_select(0, self.vocab)  # [V', D]: the head's rows
        ids, valid = left_pad(prompts, model.cfg.pad_id, device)
        self.state: DecodeState = decode_state(compiled)(model.decoder, kv, head, len(prompts), longest, self.max_new)
        self.logits = self.state.prefill(ids, valid, padded=len({len(q) for q in prompts}) > 1)  # [B, V]

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
        """Feed one token per row [B] (indices into `vocab` when there is one); returns the next logits [B, V]."""
        self.logits = self.state.step(tokens if self.vocab is None else self.vocab[tokens])
        return self.logits

    def ids(self, rows: list[list[int]]) -> list[list[int]]:
        """Token ids of rows of `vocab` indices (unchanged without a vocab)."""
        return rows if self.vocab is None else [[self.vocab_list[i] for i in r] for r in rows]

    def expand(self, copies: int) -> None:
        """Repeat each row `copies` times (beam search: the prompt ran once, its beams continue from it): B rows
        become B * copies."""
        self.state.expand(copies)
        self.logits = self.logits.repeat_interleave(copies, 0)  # [B * copies, V]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows `index` (beam search: each beam takes its parent's cache). The parents are beams of the same
        prompt, so the image's keys/values, the same in all of them, stay."""
        self.state.reorder(index)
        self.logits = self.logits.index_select(0, index)


__all__ = ["Generation", "BatchDecoder", "ban_bias", "decode_state", "left_pad"]
