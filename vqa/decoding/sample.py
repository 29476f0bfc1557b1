"""Top-k / top-p sampling (`DECODING_METHODS["sample"]`, a random method): greedy's loop
(`vqa.decoding.greedy.token_by_token`) with each token drawn from the filtered, tempered distribution."""

from __future__ import annotations

import torch

from ..config import GenerationConfig
from .batch import DecodingBatch, Generation
from .greedy import token_by_token


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


def sample(decoder: DecodingBatch, config: GenerationConfig) -> Generation:
    """Each token drawn among the allowed ones (`choices`: none banned, no <eos> before min_new_tokens), from
    logits / temperature kept to the top_k and top_p; `config.seed` makes the draws reproducible."""
    generator = None
    if config.seed is not None:
        generator = torch.Generator(device=decoder.logits.device).manual_seed(int(config.seed))

    def draw(logits: torch.Tensor, log_probs: torch.Tensor, t: int) -> torch.Tensor:
        kept = filter_logits(decoder.choices(logits, t) / config.temperature, config.top_k, config.top_p)
        return torch.multinomial(kept.softmax(-1), 1, generator=generator)[:, 0]  # [B]

    return token_by_token(decoder, config, draw)


__all__ = ["filter_logits", "sample"]
