"""One batched decoding's state (`BatchDecoder`), what the decoding methods of `vqa.decoding.generate` and
`vqa.decoding.beam` run on, and what they return (`Generation`).

The image is encoded once and each layer's cross-attention keys/values are computed once per image; the
self-attention keeps a preallocated KV cache, so every new token costs the same whatever its position.
Prompts of different lengths are left-padded: position ids count real tokens only and padding keys are
masked, and each prompt has its own length budget (the context left after *its* prompt), so a padded batch
gives exactly what the prompts give one by one. Each new token goes through `vqa.decoding.step.decode_step`, a
step of fixed shapes that runs eagerly or, with `compile=True`, through torch.compile (CUDA graphs on a GPU).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import torch

from ..config import GenerationConfig
from ..errors import InputError
from ..model import VQAModel
from .compiled import bucket, compiled_step
from .step import DecodeState, decode_step, prefill


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


# compiled: the smallest cache, every preset's whole context (at most 64 positions), so all their decodings
# share one length; longer ones are powers of two (`slot_bucket`), and rows are padded to a `bucket`
MIN_SLOTS = 64

_biases: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> {(ids, device): bias}
_biases_lock = threading.Lock()


def slots_needed(prompt_width: int, max_new: int) -> int:
    """Cache slots a decoding writes: the left-padded prompts, then every generated token but the last (which
    is chosen and never fed back)."""
    return prompt_width + max(0, max_new - 1)


def slot_bucket(slots: int) -> int:
    """The cache length a compiled decoding runs at for `slots` slots: MIN_SLOTS or the next power of two, so
    a few static shapes serve every request (torch.compile builds one graph per shape) while a long context
    (an imported GPT-2's 1,024 positions) is cached only as far as the request can write."""
    return max(MIN_SLOTS, bucket(slots))


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


class BatchDecoder:
    """The state of one batched decoding of B rows: the prompts run into preallocated caches, then one token per
    row per `step` (`vqa.decoding.step`: the same step eagerly or compiled). `budget[b]` is how many tokens row b
    may generate: the config's max_new_tokens, capped by the context left after row b's own prompt.

    With `vocab` (token ids, <eos> among them) only those tokens may follow: the LM head is computed for them
    alone, logits are [B, len(vocab)] and the methods work on indices into `vocab` (`eos` is <eos>'s index);
    `ids()` maps them back. `ban` [V] (`ban_bias`; without a vocab) is -inf on the tokens never generated:
    `choices` adds it where the methods choose. Compiled, the state holds more rows than the B the methods
    see (`bucket`): the extra rows repeat row 0 and their outputs are dropped."""

    def __init__(self, model: VQAModel, kv, prompts: list[list[int]], config: GenerationConfig,
                 vocab: torch.Tensor | None = None, compiled: bool = False, ban: torch.Tensor | None = None):
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
        self.ban = None if vocab is not None else ban  # a vocab leaves the banned tokens out instead
        self.min_new = config.min_new_tokens
        if vocab is not None:
            self.vocab = vocab.to(device)
            self.vocab_list = self.vocab.tolist()
            self.eos = self.vocab_list.index(model.cfg.eos_id)
            self.head = decoder.head_weight.index_select(0, self.vocab)  # [V', D]: the head's rows
        self.padded = len({len(q) for q in prompts}) > 1
        self.rows = len(prompts)
        self.compiled = compiled_step(decoder) if compiled else None
        if self.compiled is not None:
            fill = bucket(self.rows) - self.rows
            prompts = list(prompts) + [prompts[0]] * fill
            self.kv = kv = self._pad_rows(kv, self.rows, fill)
            # the cache as long as this request can write, in a few lengths (`slot_bucket`) that a server
            # compiles at start-up (vqa.inference.warmup); rows padded to the left share slots, so a short
            # prompt's longer budget counts from the longest prompt
            slots = slot_bucket(slots_needed(longest, self.max_new))
            self.state, self.kv = self.compiled.state(len(prompts), slots, dtype, device, kv)
        ids, valid = left_pad(prompts, model.cfg.pad_id, device)
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


__all__ = ["Generation", "BatchDecoder", "ban_bias", "left_pad", "MIN_SLOTS", "slot_bucket", "slots_needed"]
