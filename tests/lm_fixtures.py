"""A tiny random GPT-2 saved in the Hugging Face layout (config.json, model.safetensors, tokenizer.json) by
`transformers` itself, for the pretrained-decoder tests. `transformers` is a test-only dependency (the `dev`
extra); vqa reads the folder with safetensors and tokenizers alone.

The tokenizer is a byte-level BPE like GPT-2's (no normalizer, case kept, `Ġ` for a leading space,
`<|endoftext|>` as its only special token), trained on the given texts. The weights are redrawn with a
larger spread than GPT-2's initialization (std 0.02), so that logits depend clearly on token, position and
context and a wrong mapping (a missed transpose, a swapped LayerNorm) cannot hide inside the tolerance.
`lm_model` builds a VQAModel whose decoder is such a folder's language model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vqa.model import VQAModel
from vqa.weights.language_model import build_model, model_preset

WORDS = ("What color is the small circle? Is there a red square left of the blue triangle? How many shapes "
         "are there? Two green stars and a yellow circle on a grey background. Yes no one three four five.")


def save_tiny_gpt2(folder: str | Path, texts: list[str] | None = None, *, n_embd: int = 32, n_layer: int = 2,
                   n_head: int = 4, n_positions: int = 64, vocab: int = 400, seed: int = 0, std: float = 0.2,
                   rows: int | None = None, **config) -> Path:
    """Write a random GPT-2 of the given size into `folder`; `rows` overrides its vocabulary size (the
    embedding's rows) to make a tokenizer / weights mismatch; `config` adds GPT2Config fields."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder)
    tok = save_tokenizer(folder, texts, vocab)
    end = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=rows or tok.get_vocab_size(), n_positions=n_positions, n_embd=n_embd,
                     n_layer=n_layer, n_head=n_head, bos_token_id=end, eos_token_id=end, **config)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + std * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    model.save_pretrained(folder)
    return folder


def save_tokenizer(folder: Path, texts: list[str] | None, vocab: int):
    """A byte-level BPE tokenizer.json like GPT-2's (and SmolLM2's, Llama 3's, Qwen's) in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts or []) + [WORDS] * 4, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def edit_config(folder: Path, **changes) -> None:
    """Change fields of `folder/config.json` (None removes a field)."""
    path = Path(folder) / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def hf_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' GPT2LMHeadModel on the same folder: logits [B, T, V] for ids [B, T]."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(ids).logits


# the pretrained-decoder tests' model (test_pretrained_lm*.py) on a saved GPT-2 (conftest.py's `gpt2_dir`):
# a small ViT on 32 px images, so that the model builds in milliseconds; the decoder is the language model's
VIT = dict(vit_width=32, vit_depth=1, vit_heads=2, vit_image_size=32, vit_patch_size=8)


def lm_model(folder, seed: int = 0, **overrides) -> VQAModel:
    torch.manual_seed(seed)
    return build_model(model_preset("tiny", dec_pretrained=str(folder), dec_max_len=64, **VIT, **overrides)).eval()


def text_vocab(folder) -> int:
    from tokenizers import Tokenizer as HF

    return HF.from_file(str(folder / "tokenizer.json")).get_vocab_size()
