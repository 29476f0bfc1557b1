"""A tiny random VisionEncoderDecoderModel (ViTModel + GPT2LMHeadModel with cross-attention) saved by
`transformers` itself, with a ViTImageProcessor and a GPT-2-style byte-level BPE tokenizer (tokenizer.json and
vocab.json + merges.txt), for the `vqa import` / `vqa export --transformers` tests. Nothing is downloaded.

The weights are redrawn with a larger spread than the initialization's (std 0.02) so that logits depend
clearly on the image, the token and the position: a wrong mapping cannot hide inside the tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ("a red circle and a blue square on a grey background. two green stars. a small yellow triangle left of "
         "a big purple circle. there are three shapes. one orange square.")


def save_gpt2_tokenizer(folder: Path, vocab: int = 300):
    """A byte-level BPE like GPT-2's (its <|endoftext|> last, as in GPT-2), written as tokenizer.json and as
    GPT-2's vocab.json + merges.txt. Returns the `tokenizers.Tokenizer`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([WORDS] * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok.save(str(folder / "tokenizer.json"))
    tok.model.save(str(folder))  # vocab.json, merges.txt (without the added token)
    vocab_json = json.loads((folder / "vocab.json").read_text())
    vocab_json["<|endoftext|>"] = tok.token_to_id("<|endoftext|>")
    (folder / "vocab.json").write_text(json.dumps(vocab_json))
    return tok


def save_tiny_ved(folder: str | Path, *, dec_width: int = 48, enc_width: int = 32, n_layer: int = 2,
                  n_positions: int = 40, image_size: int = 32, patch_size: int = 8, seed: int = 0,
                  std: float = 0.2, pooler: bool = True, bin_file: bool = False, tokenizer_json: bool = True) -> Path:
    """Write a random VisionEncoderDecoderModel into `folder` (dec_width == enc_width: no enc_to_dec_proj)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
        ViTModel,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = save_gpt2_tokenizer(folder)
    if not tokenizer_json:
        (folder / "tokenizer.json").unlink()
    end = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    enc = ViTConfig(hidden_size=enc_width, num_hidden_layers=2, num_attention_heads=2, intermediate_size=2 * enc_width,
                    image_size=image_size, patch_size=patch_size)
    dec = GPT2Config(n_embd=dec_width, n_layer=n_layer, n_head=2, vocab_size=tok.get_vocab_size(),
                     n_positions=n_positions, add_cross_attention=True, is_decoder=True, bos_token_id=end,
                     eos_token_id=end)
    model = VisionEncoderDecoderModel(encoder=ViTModel(enc, add_pooling_layer=pooler), decoder=GPT2LMHeadModel(dec))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or ".ln_" in name:
                p.copy_((1 + std * torch.randn_like(p)) if name.endswith("weight") else std * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    model.config.decoder_start_token_id = end
    model.config.pad_token_id = end
    model.config.eos_token_id = end
    model.eval()
    model.save_pretrained(folder)
    if bin_file:  # the layout of older checkpoints: a pickle with the LM head and the causal-mask buffers
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        state["decoder.lm_head.weight"] = state["decoder.transformer.wte.weight"].clone()
        for i in range(n_layer):
            state[f"decoder.transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(n_positions, n_positions))[None, None]
            state[f"decoder.transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return folder


def load_ved(folder: str | Path):
    from transformers import VisionEncoderDecoderModel

    return VisionEncoderDecoderModel.from_pretrained(str(folder)).eval()


def images(n: int = 4, size: int = 32, seed: int = 1) -> torch.Tensor:
    """`n` normalized images of different content: random noise and solid / split colours."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    if n > 1:
        x[1] = torch.tensor([1.0, -1.0, 0.5])[:, None, None]
    if n > 2:
        x[2, :, :, : size // 2] = -1.0
    return x


def edit_json(path: Path, **changes) -> None:
    """Change fields of a JSON object file (None removes a field; a dotted key reaches into a sub-object)."""
    d = json.loads(Path(path).read_text())
    for key, v in changes.items():
        *parents, last = key.split(".")
        obj = d
        for p in parents:
            obj = obj[p]
        if v is None:
            obj.pop(last, None)
        else:
            obj[last] = v
    Path(path).write_text(json.dumps(d))
