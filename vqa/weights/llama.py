"""Start the llama-layout decoder (`vqa.model.llama_decoder`) from a Llama-layout language model in the Hugging
Face layout: SmolLM2, Llama 3.x, Qwen2 / Qwen2.5 (biases on q, k, v) and Qwen3 (RMSNorm on q and k).

    --set dec_pretrained=FOLDER   config.json (model_type llama, qwen2 or qwen3), model.safetensors (or an
                                  index + shards), tokenizer.json

The weights map one to one (nn.Linear on both sides, nothing transposed; q | k | v and gate | up stacked by
rows; lm_head absent when tie_word_embeddings): `load_llama` names each.

The cross-attention blocks (`cross`) are new, their gates at 0. Vocabulary: the model's tokenizer with vqa's
special tokens after it, their embedding (and untied head) rows drawn as for GPT-2 (`lm_folder.new_rows`).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import torch

from ..errors import ConfigError
from ..json_object import read_object
from .lm_folder import check_built_for, checked_weights, copy_vocab, resolve, text_vocab

MODEL_TYPES = ("llama", "qwen2", "qwen3")  # config.json model_type values whose layers are LlamaBlock's
_IGNORED = re.compile(r".*rotary_emb\.inv_freq")  # old files' rotary tables
# the ModelConfig fields a Llama-layout language model fixes (beside width, depth, heads, MLP, epsilon)
LLAMA_FIELDS = ("dec_layout", "dec_positions", "dec_activation", "dec_embed_scale", "dec_qk_norm", "dec_kv_heads",
                "dec_head_dim", "dec_rope_theta", "dec_rope_scaling", "dec_qkv_bias", "dec_tie_head")


def model_type(folder: Path) -> str | None:
    """config.json's model_type, or None where the file is missing or not an object."""
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return raw.get("model_type") if isinstance(raw, dict) else None


def _positive_int(c: dict, key: str, path: str) -> int:
    v = c.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"{path}: {key} must be a positive integer, got {v!r}")
    return v


def _rope(c: dict, path: str) -> tuple[float, tuple | None]:
    """(rope_theta, Llama 3's scaling or None) from `rope_parameters` (transformers 5) or `rope_theta` +
    `rope_scaling` (older files)."""
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    theta = params.get("rope_theta", c.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind == "llama3":
        try:
            return float(theta), tuple(float(params[k]) for k in (
                "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: rope_type 'llama3' needs factor, low_freq_factor, high_freq_factor and "
                              "original_max_position_embeddings") from None
    raise ConfigError(f"{path}: rope_type {kind!r} is not supported (the decoder has the default rotary positions "
                      "and Llama 3's scaling)")


def check_config(raw: dict, path: str) -> dict:
    """The decoder-relevant fields of a Llama / Qwen2 / Qwen3 config.json object, checked."""
    kind = raw.get("model_type")
    c = dict(raw)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings"):
        c[key] = _positive_int(c, key, path)
    c["num_key_value_heads"] = c.get("num_key_value_heads") or c["num_attention_heads"]
    _positive_int(c, "num_key_value_heads", path)
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise ConfigError(f"{path}: num_attention_heads={c['num_attention_heads']} is not a multiple of "
                          f"num_key_value_heads={c['num_key_value_heads']}")
    if c.get("head_dim") is None:
        if c["hidden_size"] % c["num_attention_heads"]:
            raise ConfigError(f"{path}: hidden_size={c['hidden_size']} is not divisible by num_attention_heads="
                              f"{c['num_attention_heads']} and there is no head_dim")
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    _positive_int(c, "head_dim", path)
    if c.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{path}: hidden_act {c['hidden_act']!r} is not supported (the decoder's MLP is SwiGLU)")
    eps = c.setdefault("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ConfigError(f"{path}: rms_norm_eps must be a positive number, got {eps!r}")
    if c.get("mlp_bias"):
        raise ConfigError(f"{path}: mlp_bias=true is not supported (the decoder's SwiGLU has no biases)")
    if c.get("use_sliding_window"):
        raise ConfigError(f"{path}: use_sliding_window=true is not supported (the decoder attends to every "
                          "earlier token)")
    if round(c["hidden_size"] * (c["intermediate_size"] / c["hidden_size"])) != c["intermediate_size"]:
        raise ConfigError(f"{path}: intermediate_size={c['intermediate_size']} is not a width dec_mlp_ratio "
                          "can express")
    c["rope_theta"], c["rope_llama3"] = _rope(c, path)
    c["qkv_bias"] = kind == "qwen2" or bool(c.get("attention_bias", False))
    c["tie_word_embeddings"] = bool(c.get("tie_word_embeddings", False))
    c["n_positions"] = c["max_position_embeddings"]  # what language_model.decoder_fields reads
    return c


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    return check_config(read_object(path, ConfigError), str(path))


def architecture(c: dict) -> dict:
    """The ModelConfig decoder fields of a checked config `c`."""
    d = c["hidden_size"]
    return dict(dec_layout="llama", dec_positions="rotary", dec_activation="silu", dec_embed_scale=False,
                dec_qk_norm=c["model_type"] == "qwen3", dec_width=d, dec_depth=c["num_hidden_layers"],
                dec_heads=c["num_attention_heads"],
                dec_kv_heads=c["num_key_value_heads"],
                dec_head_dim=None if c["head_dim"] * c["num_attention_heads"] == d else c["head_dim"],
                dec_mlp_ratio=c["intermediate_size"] / d, dec_norm_eps=float(c["rms_norm_eps"]),
                dec_rope_theta=c["rope_theta"], dec_rope_scaling=c["rope_llama3"], dec_qkv_bias=c["qkv_bias"],
                dec_tie_head=c["tie_word_embeddings"])


def expected(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor such a model has, with its shape ([out, in] for a weight)."""
    d, v, hd, hid = c["hidden_size"], c["vocab_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                    p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                    p + "mlp.gate_proj.weight": (hid, d), p + "mlp.up_proj.weight": (hid, d),
                    p + "mlp.down_proj.weight": (d, hid)})
        if c["qkv_bias"]:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
        if c["model_type"] == "qwen3":
            out.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    return out


def parameter_count(c: dict) -> int:
    return sum(int(torch.Size(s).numel()) for s in expected(c).values())


@torch.no_grad()
def load_llama(decoder, source: str) -> None:
    """Copy the language model `source` into `decoder` (a LlamaDecoder built for it by `model_preset`)."""
    folder = resolve(source)
    c = read_config(folder)
    check_built_for(decoder.cfg, architecture(c), folder / "config.json")
    n_text = text_vocab(folder)
    vocab = decoder.embed.weight.shape[0]
    with contextlib.ExitStack() as stack:
        w = checked_weights(folder, stack, expected(c), _IGNORED)
        if n_text > c["vocab_size"] or vocab < n_text:
            raise ConfigError(f"{folder / 'tokenizer.json'} has {n_text} tokens but the embedding in "
                              f"{folder / w.label} has {c['vocab_size']} rows and the decoder {vocab}: tokenizer and "
                              "weights do not match")

        def put(param: torch.Tensor, *names: str) -> None:
            param.copy_(torch.cat([w.get(n) for n in names]).to(param.dtype))

        copy_vocab(decoder.embed.weight, w.get("model.embed_tokens.weight"), n_text)
        if decoder.head is not None:
            copy_vocab(decoder.head, w.get("lm_head.weight"), n_text)
        for i, blk in enumerate(decoder.blocks):
            p, a = f"model.layers.{i}.", blk.self_attn
            put(blk.ln1.weight, p + "input_layernorm.weight")
            put(blk.ln2.weight, p + "post_attention_layernorm.weight")
            put(a.qkv.weight, *(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
            if c["qkv_bias"]:
                put(a.qkv.bias, *(p + f"self_attn.{x}_proj.bias" for x in "qkv"))
            put(a.proj.weight, p + "self_attn.o_proj.weight")
            if c["model_type"] == "qwen3":
                put(a.q_norm.weight, p + "self_attn.q_norm.weight")
                put(a.k_norm.weight, p + "self_attn.k_norm.weight")
            put(blk.mlp.gate_up.weight, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
            put(blk.mlp.down.weight, p + "mlp.down_proj.weight")
        put(decoder.ln_f.weight, "model.norm.weight")
        for blk in decoder.cross:  # the new blocks add nothing until training opens their gates
            blk.attn_gate.zero_()
            blk.mlp_gate.zero_()
