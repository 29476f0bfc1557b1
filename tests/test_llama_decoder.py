"""A decoder started from a Llama-layout language model (`dec_layout="llama"`): with the cross-attention
gates at zero its logits equal transformers' own model on the same folder (Llama with grouped-query attention
and Llama 3's rotary scaling, SmolLM2's tied head, Qwen2's q/k/v biases, Qwen3's q/k norm), cached generation
equals uncached, and configs the decoder cannot hold are refused in one line."""

from __future__ import annotations

import pytest
import torch
from helpers import random_images
from lm_fixtures import VIT, text_vocab
from llama_fixtures import FAMILIES, hf_llama_logits, save_tiny_llama

from vqa.model import VQAModel, model_preset
from vqa.tokenizer import SPECIAL_TOKENS


def llama_model(folder, seed=0, **overrides) -> VQAModel:
    torch.manual_seed(seed)
    fields = dict(dec_max_len=64, **VIT, **overrides)
    return VQAModel(model_preset("tiny", dec_pretrained=str(folder), **fields)).eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_transformers_with_the_gates_at_zero(tmp_path, family):
    folder = save_tiny_llama(tmp_path / family, family)
    model = llama_model(folder, dec_cross_every=2)
    assert len(model.decoder.cross) == 2  # before layers 0 and 2 of 3
    n = text_vocab(folder)
    ids = torch.randint(0, n, (3, model.cfg.dec_max_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(random_images(3, model.cfg), ids).logits
        other_images = model(random_images(3, model.cfg, seed=1), ids).logits
    assert ours.shape[-1] == n + len(SPECIAL_TOKENS)
    ref = hf_llama_logits(folder, ids)
    assert ref.abs().max() > 1.0
    assert (ours[..., :n] - ref).abs().max() < 1e-4
    assert torch.equal(ours, other_images)  # the gates at zero: the image changes nothing yet
