"""Greedy decoding (`DECODING_METHODS["greedy"]`), and `token_by_token`, the loop it shares with sampling
(`vqa.decoding.sample`): each step picks one token per row, by a rule the method gives."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import GenerationConfig
from .batch import DecodingBatch, Generation

# (step t's logits [B, V], their log-softmax [B, V], t) -> the token chosen for each row [B]
Choose = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def greedy(decoder: DecodingBatch, config: GenerationConfig) -> Generation:
    """The likeliest allowed token at every step."""
    return token_by_token(decoder, config, lambda logits, log_probs, t: decoder.choices(log_probs, t).argmax(-1))


def token_by_token(decoder: DecodingBatch, config: GenerationConfig, choose: Choose) -> Generation:
    """Feed each row the token `choose` picks until every row has produced <eos> or used its budget. A row's
    sequence stops before its first <eos>, and its score is the model's log-probability of the tokens chosen,
    that <eos> included."""
    eos, b, n = decoder.eos, len(decoder.budget), decoder.max_new
    device = decoder.logits.device
    # per step: the tokens chosen [B] and their log-probabilities; a row's tokens after its first <eos> are
    # ignored (the row is still fed, so the batch keeps its shape), so the loop does no per-row bookkeeping
    chosen, chosen_log_probs = [], []
    spent = torch.as_tensor(decoder.budget, device=device) <= torch.arange(1, n + 1, device=device)[:, None]  # [T, B]
    done = torch.zeros(b, dtype=torch.bool, device=device)  # the row produced <eos>
    logits = decoder.logits
    for t in range(n):
        log_probs = logits.log_softmax(-1)  # [B, V]: the model's distribution, which scores the tokens chosen
        token = choose(logits, log_probs, t)
        chosen.append(token)
        chosen_log_probs.append(log_probs.gather(1, token[:, None])[:, 0])
        if decoder.watch is not None:  # streaming: each row's tokens so far, up to its <eos> and budget
            rows = [r[:n] for r, n in zip(torch.stack(chosen, 1).tolist(), decoder.budget, strict=True)]
            decoder.watch(decoder.ids([r[: r.index(eos)] if eos in r else r for r in rows]))
        if t == n - 1:
            break
        # every row ended or used its budget? (no row can end while <eos> is still forbidden)
        if t + 1 >= config.min_new_tokens:
            done |= token == eos
            if bool((done | spent[t]).all()):
                break
        logits = decoder.step(token)
    tokens, log_probs = torch.stack(chosen, 1).tolist(), torch.stack(chosen_log_probs, 1).tolist()  # [B, T]
    sequences, scores = [], []
    for i in range(b):
        row = tokens[i][: decoder.budget[i]]
        end = row.index(eos) if eos in row else len(row)  # the sequence stops before <eos> ...
        sequences.append(row[:end])
        scores.append(sum(log_probs[i][: min(end + 1, len(row))]))  # ... and its score counts <eos>
    return Generation(sequences=decoder.ids(sequences), scores=scores)


__all__ = ["greedy", "token_by_token", "Choose"]
