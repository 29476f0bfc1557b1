"""Growing a model's vocabulary: a captioner imported from transformers (`vqa import`) has GPT-2's tokenizer
alone; fine-tuning it for VQA (`vqa train --init-from`) adds <question> and <answer>
(`Tokenizer.with_prompt_tokens`), and its embedding, with the LM head tied to it, gains their rows."""

from __future__ import annotations

import torch

from .encoder_decoder import VQAModel
from .pretrained_lm import new_rows


@torch.no_grad()
def grow_embedding(model: VQAModel, vocab_size: int) -> VQAModel:
    """A copy of `model` with `vocab_size` token rows: the old rows as they were, the new ones at the mean
    embedding plus a small offset (`pretrained_lm.new_rows`). Every other weight is unchanged."""
    old = model.decoder.embed.weight.detach()
    if vocab_size < old.shape[0]:
        raise ValueError(f"cannot shrink the vocabulary from {old.shape[0]} to {vocab_size} tokens")
    grown = VQAModel(model.cfg.replace(vocab_size=vocab_size), load_pretrained=False)
    state = model.state_dict()
    state["decoder.embed.weight"] = torch.cat([old, new_rows(old, vocab_size - old.shape[0]).to(old)])
    grown.load_state_dict(state, strict=True)
    return grown.to(old.device)
