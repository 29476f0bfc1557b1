"""Start the text decoder from a pretrained causal language model in the Hugging Face layout, of either family.

    --set dec_pretrained=FOLDER   a folder with config.json, model.safetensors (or an index + shards), tokenizer.json
    --set dec_pretrained=NAME     the same files from the Hugging Face Hub (huggingface_hub's cache; needs internet)

A folder's config.json model_type picks the family: GPT-2 (`vqa.weights.gpt2`) keeps the decoder's own layout; a
Llama layout's (`llama.MODEL_TYPES`: Llama, SmolLM2, Qwen2, Qwen3) gets the llama-layout decoder
(`vqa.weights.llama`). `model_preset` gives the ModelConfig the language model fixes (architecture, vocabulary);
`build_model` builds the model of a config and copies the language model's weights into its decoder.
"""

from __future__ import annotations

from pathlib import Path

from ..config import GPT2_DECODER, ModelConfig, preset_fields
from ..errors import ConfigError
from ..model import VQAModel
from ..tokenizer import Tokenizer
from . import gpt2, llama
from .lm_folder import free_memory, resolve


def read_config(folder: Path) -> dict:
    """config.json with GPT-2's defaults for absent fields, checked: ConfigError naming the field otherwise.
    A Llama-layout model's (`llama.MODEL_TYPES`) is checked by `llama.check_config`."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: missing (a pretrained decoder needs config.json, model.safetensors and "
                          "tokenizer.json in its folder)")
    if llama.model_type(folder) in llama.MODEL_TYPES:
        return llama.read_config(folder)
    return gpt2.read_config(folder)


def tokenizer(source: str) -> Tokenizer:
    """The language model's own tokenizer with vqa's special tokens (`Tokenizer.for_language_model`)."""
    return Tokenizer.for_language_model(resolve(source))


def decoder_fields(source: str, dec_max_len: int) -> dict:
    """The ModelConfig fields the language model fixes: its architecture and its tokenizer's ids. Checks that
    dec_max_len fits its positions and that its weights fit in memory, before any model is built."""
    folder = resolve(source)
    c = read_config(folder)
    path = folder / "config.json"
    is_llama = c.get("model_type") in llama.MODEL_TYPES
    if dec_max_len > c["n_positions"]:
        key = "max_position_embeddings" if is_llama else "n_positions"
        raise ConfigError(f"{path}: dec_max_len={dec_max_len} is longer than the language model's "
                          f"{key}={c['n_positions']}: --set dec_max_len={c['n_positions']} or less")
    n_params = (llama if is_llama else gpt2).parameter_count(c)
    free = free_memory()
    if free is not None and 4 * n_params > free:
        emb = c["vocab_size"] * c["hidden_size" if is_llama else "n_embd"] * 4
        raise ConfigError(
            f"{path}: {n_params / 1e6:.0f} M parameters need {4 * n_params / 1e9:.1f} GB as float32 (the "
            f"{c['vocab_size']}-token vocabulary alone {emb / 1e9:.2f} GB), more than the {free / 1e9:.1f} GB of "
            "memory free here: choose a smaller language model (distilgpt2: 82 M, gpt2: 124 M parameters)")
    return {**(llama if is_llama else gpt2).architecture(c), **tokenizer(source).model_ids()}


# the ModelConfig fields a language model fixes (`architecture`): a run whose decoder started from one keeps them
LM_FIELDS = ("dec_pretrained", *GPT2_DECODER, "dec_width", "dec_depth", "dec_heads", "dec_mlp_ratio", "dec_norm_eps",
             *llama.LLAMA_FIELDS)


def model_preset(name: str, **overrides) -> ModelConfig:
    """The named preset's ModelConfig (`vqa.config.preset`), with a pretrained language model's decoder.
    With `dec_pretrained` (a language model folder or Hub name), the decoder's architecture and vocabulary
    are the language model's (`decoder_fields`: width, depth, heads, MLP, positions, activation, LayerNorm
    epsilon, and its tokenizer's size with vqa's special tokens): they replace the preset's, and an override
    that contradicts them is an error. `dec_pretrained=None` skips this."""
    fields = preset_fields(name, overrides)
    if fields.get("dec_pretrained"):
        lm = decoder_fields(fields["dec_pretrained"], fields.get("dec_max_len", ModelConfig.dec_max_len))
        clash = [f"{k}={overrides[k]!r} (the language model has {v!r})" for k, v in lm.items()
                 if k in overrides and overrides[k] != v]
        if clash:
            raise ConfigError(f"dec_pretrained={fields['dec_pretrained']!r} fixes the decoder's architecture and "
                              f"vocabulary; remove " + ", ".join(clash))
        fields.update(lm)
    return ModelConfig(**fields)


def load_decoder(decoder, source: str) -> None:
    """Copy the language model `source` into `decoder` (a TextDecoder or LlamaDecoder built for it)."""
    if decoder.cfg.dec_layout == "llama":
        llama.load_llama(decoder, source)
    else:
        gpt2.load_decoder(decoder, source)


def build_model(cfg: ModelConfig) -> VQAModel:
    """The model of `cfg`, its ViT holding `vit_pretrained` / `vit_weights`' weights and its decoder
    `dec_pretrained`'s where the config names them (`VQAModel(cfg)` alone leaves every weight random; a
    checkpoint's own weights replace them anyway)."""
    model = VQAModel(cfg)
    if cfg.vit_pretrained or cfg.vit_weights:
        from .vit import load_vit

        load_vit(model.vision.vit, cfg)
    if cfg.dec_pretrained:
        load_decoder(model.decoder, cfg.dec_pretrained)
    return model
