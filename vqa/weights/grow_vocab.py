"""Growing a model's vocabulary: a captioner imported from transformers (`vqa import`) has GPT-2's tokenizer
alone; fine-tuning it for VQA (`vqa train --init-from`) adds <question> and <answer>
(`Tokenizer.with_prompt_tokens`), and its embedding, with the LM head tied to it, gains their rows."""

from __future__ import annotations

import torch

from ..model import VQAModel
from .lm_folder import new_rows


@torch.no_grad()
def grow_embedding(model: VQAModel, vocab_size: int, offset: bool = True) -> VQAModel:
    """A copy of `model` with `vocab_size` token rows: the old rows as they were, the new ones at the mean
    embedding plus a small random offset (`lm_folder.new_rows`), or at exactly the mean (`offset=False`:
    the same file every time). Every other weight is unchanged."""
    old = model.decoder.embed.weight.detach()
    if vocab_size < old.shape[0]:
        raise ValueError(f"cannot shrink the vocabulary from {old.shape[0]} to {vocab_size} tokens")
    grown = VQAModel(model.cfg.replace(vocab_size=vocab_size))
    state = model.state_dict()
    n = vocab_size - old.shape[0]
    rows = new_rows(old, n) if offset else old.float().mean(0).expand(n, -1)
    state["decoder.embed.weight"] = torch.cat([old, rows.to(old)])
    grown.load_state_dict(state, strict=True)
    return grown.to(old.device)
