"""Tiny random Llama-layout language models (Llama, Qwen2, Qwen3) saved in the Hugging Face layout by
`transformers` itself (no download), for the llama-layout decoder tests. As for GPT-2 (lm_fixtures.py) the
weights are redrawn with a large spread, so a wrong mapping cannot hide inside the tolerance."""

from __future__ import annotations

from pathlib import Path

import torch
from lm_fixtures import save_tokenizer

# per family: the transformers classes and the config fields that exercise its differences
FAMILIES = {
    # grouped-query attention (4 query heads, 2 key/value heads), Llama 3's rotary scaling, an untied head
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_key_value_heads=2, tie_word_embeddings=False, rope_theta=50000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16))),
    # SmolLM2's: tied head, plain rotary positions
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    # biases on q, k and v
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    # RMSNorm on queries and keys, a head width that is not hidden_size / heads
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=16,
                                                     tie_word_embeddings=False)),
}


def save_tiny_llama(folder: str | Path, family: str = "llama", *, hidden: int = 32, layers: int = 3,
                    heads: int = 4, seed: int = 0, std: float = 0.2, **config) -> Path:
    import transformers

    cfg_cls, model_cls, fields = FAMILIES[family]
    folder = Path(folder)
    tok = save_tokenizer(folder, None, 400)
    end = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=heads, max_position_embeddings=128, bos_token_id=end, eos_token_id=end,
        **{**fields, **config})
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + std * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    model.save_pretrained(folder)
    return folder


def hf_llama_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own model on the same folder: logits [B, T, V] for ids [B, T]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits
