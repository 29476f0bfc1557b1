"""A GPT-2 in the Hugging Face layout as the text decoder: its config.json checked, its tensor names, its weights
copied in (`vqa.weights.language_model` picks the family of a `dec_pretrained` folder and calls this).

GPT-2's pre-LN blocks are this decoder's blocks without their cross-attention, so its weights map one to one
(BLOCK_KEYS; wte is the embedding and the tied LM head, wpe[:dec_max_len] the learned positions; GPT-2's Conv1D
stores a weight as [in, out], nn.Linear as [out, in]: each is transposed).

The width, depth, heads, MLP width, activation (gelu_new: the tanh GELU), LayerNorm epsilon and number of
positions come from config.json (`architecture`, used by `language_model.model_preset`). Each block's cross-attention
(ln2, cross_attn) is new, and its output projection starts at zero (weight and bias): the blocks add exactly
nothing at step 0, so the decoder *is* the language model. It is a zero-initialized projection, not a gate:
nothing extra runs per token. The projection learns first (its gradient is the attention output); the
queries, keys and values get gradients from the second step on.

Vocabulary: the language model's own tokenizer with vqa's seven special tokens added after it
(`Tokenizer.for_language_model`). Embedding rows 0..n-1 are the model's; the added rows start at the mean of
the model's rows plus a small random offset (so their logits start ordinary and <question> differs from
<answer> even with the decoder frozen). Rows the model has beyond its tokenizer (padding) are dropped.

Weights are read with safetensors (no pickle; `transformers` is not needed). Bad folders get a ConfigError
naming the file and the field at fault. Families that map and those that do not: docs/pretrained.md.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch

from ..config import GPT2_DECODER
from ..errors import ConfigError
from ..json_object import read_object
from .llama import MODEL_TYPES as LLAMA_TYPES
from .llama import model_type
from .llama import read_config as read_llama_config
from .lm_folder import check_built_for, checked_weights, copy_vocab, resolve, text_vocab

SUPPORTED = ("gpt2",)  # config.json model_type values whose blocks are this decoder's
# GPT-2's defaults (transformers' GPT2Config) for fields a config.json may leave out
GPT2_DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5, scale_attn_weights=True,
                     scale_attn_by_inverse_layer_idx=False, tie_word_embeddings=True)
# activation_function -> dec_activation (gelu_new, gelu_fast and the pytorch tanh GELU are one formula)
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_python_tanh": "gelu_tanh"}


# ----------------------------------------------------------------------------------------- finding the files


def read_config(folder: Path) -> dict:
    """config.json of a GPT-2 with GPT-2's defaults for absent fields, checked: ConfigError naming the field
    otherwise."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: missing (a pretrained decoder needs config.json, model.safetensors and "
                          "tokenizer.json in its folder)")
    return check_config(read_object(path, ConfigError), str(path))


def check_config(raw: dict, path: str) -> dict:
    """A GPT-2 config object (`raw`, read from `path`) with GPT-2's defaults for absent fields, checked."""
    kind = raw.get("model_type")
    if kind not in SUPPORTED:
        arch = f" ({', '.join(map(str, raw['architectures']))})" if isinstance(raw.get("architectures"), list) else ""
        raise ConfigError(f"{path}: model_type {kind!r}{arch} is not supported: the decoder loads GPT-2-layout "
                          f"and Llama-layout language models (model_type "
                          f"{', '.join(map(repr, SUPPORTED + LLAMA_TYPES))})")
    c = {**GPT2_DEFAULTS, **raw}
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if not isinstance(c[key], int) or isinstance(c[key], bool) or c[key] < 1:
            raise ConfigError(f"{path}: {key} must be a positive integer, got {c[key]!r}")
    if c["n_inner"] is not None and (not isinstance(c["n_inner"], int) or c["n_inner"] < 1):
        raise ConfigError(f"{path}: n_inner must be a positive integer or null, got {c['n_inner']!r}")
    if c["activation_function"] not in ACTIVATIONS:
        raise ConfigError(f"{path}: activation_function {c['activation_function']!r} is not supported "
                          f"(the decoder has {', '.join(ACTIVATIONS)})")
    if not isinstance(c["layer_norm_epsilon"], (int, float)) or not c["layer_norm_epsilon"] > 0:
        raise ConfigError(f"{path}: layer_norm_epsilon must be a positive number, got {c['layer_norm_epsilon']!r}")
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("tie_word_embeddings", True)):
        if bool(c[key]) != want:
            raise ConfigError(f"{path}: {key}={c[key]!r} is not supported (the decoder needs {key}={want}: "
                              "attention scaled by 1/sqrt(head size) in every layer, the LM head tied to wte)")
    if c["n_embd"] % c["n_head"]:
        raise ConfigError(f"{path}: n_embd={c['n_embd']} is not divisible by n_head={c['n_head']}")
    c["hidden"] = c["n_inner"] or 4 * c["n_embd"]
    if int(c["n_embd"] * (c["hidden"] / c["n_embd"])) != c["hidden"]:
        raise ConfigError(f"{path}: n_inner={c['n_inner']} is not a width the decoder's dec_mlp_ratio can express")
    return c


def architecture(c: dict) -> dict:
    """The ModelConfig decoder fields of a checked config.json `c`."""
    return dict(GPT2_DECODER, dec_width=c["n_embd"], dec_depth=c["n_layer"], dec_heads=c["n_head"],
                dec_mlp_ratio=c["hidden"] / c["n_embd"], dec_activation=ACTIVATIONS[c["activation_function"]],
                dec_norm_eps=float(c["layer_norm_epsilon"]))


# ----------------------------------------------------------------------------------------- the weights


def _expected(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 of config `c` has, with its shape (Conv1D weights are [in, out])."""
    d = c["n_embd"]
    out = {"wte.weight": (c["vocab_size"], d), "wpe.weight": (c["n_positions"], d),
           "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(c["n_layer"]):
        out.update({f"h.{i}.{k}": s for k, s in block_shapes(d, c["hidden"], cross=False).items()})
    return out


def block_shapes(d: int, h: int, cross: bool) -> dict[str, tuple[int, ...]]:
    """A GPT-2 block's tensors, with its cross-attention's where `cross` (Conv1D weights are [in, out])."""
    out = {}
    for ln in ("ln_1", "ln_2", "ln_cross_attn")[: 3 if cross else 2]:
        out[f"{ln}.weight"], out[f"{ln}.bias"] = (d,), (d,)
    cross_linear = {"crossattention.q_attn": (d, d), "crossattention.c_attn": (d, 2 * d),
                    "crossattention.c_proj": (d, d)} if cross else {}
    for name, (i, o) in {"attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d), **cross_linear, "mlp.c_fc": (d, h),
                         "mlp.c_proj": (h, d)}.items():
        out[f"{name}.weight"], out[f"{name}.bias"] = (i, o), (o,)
    return out


def parameter_count(c: dict) -> int:
    return sum(int(torch.Size(s).numel()) for s in _expected(c).values())


# a GPT-2 block's tensors -> this decoder block's (name in GPT-2's h.i., name in DecoderBlock, Conv1D: transposed)
BLOCK_KEYS = (
    ("ln_1.weight", "ln1.weight", False), ("ln_1.bias", "ln1.bias", False),
    ("attn.c_attn.weight", "self_attn.qkv.weight", True), ("attn.c_attn.bias", "self_attn.qkv.bias", False),
    ("attn.c_proj.weight", "self_attn.proj.weight", True), ("attn.c_proj.bias", "self_attn.proj.bias", False),
    ("ln_2.weight", "ln3.weight", False), ("ln_2.bias", "ln3.bias", False),
    ("mlp.c_fc.weight", "mlp.0.weight", True), ("mlp.c_fc.bias", "mlp.0.bias", False),
    ("mlp.c_proj.weight", "mlp.2.weight", True), ("mlp.c_proj.bias", "mlp.2.bias", False),
)
# the cross-attention of a GPT-2 built with add_cross_attention (its c_attn is [key | value], as our kv)
CROSS_KEYS = (
    ("ln_cross_attn.weight", "ln2.weight", False), ("ln_cross_attn.bias", "ln2.bias", False),
    ("crossattention.q_attn.weight", "cross_attn.q.weight", True),
    ("crossattention.q_attn.bias", "cross_attn.q.bias", False),
    ("crossattention.c_attn.weight", "cross_attn.kv.weight", True),
    ("crossattention.c_attn.bias", "cross_attn.kv.bias", False),
    ("crossattention.c_proj.weight", "cross_attn.proj.weight", True),
    ("crossattention.c_proj.bias", "cross_attn.proj.bias", False),
)

_IGNORED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight")  # causal-mask buffers; the tied head


@torch.no_grad()
def load_decoder(decoder, source: str) -> None:
    """Copy the language model `source` into `decoder` (a TextDecoder built from `preset(...,
    dec_pretrained=source)`), and zero every cross-attention output projection."""
    folder = resolve(source)
    kind = model_type(folder)
    if kind in LLAMA_TYPES:
        read_llama_config(folder)  # a Llama config's own errors first
        raise ConfigError(f"{folder / 'config.json'}: a {kind} model needs dec_layout='llama'; build the "
                          "config with vqa.weights.language_model.model_preset(..., dec_pretrained=...)")
    c = read_config(folder)
    check_built_for(decoder.cfg, architecture(c), folder / "config.json")
    if decoder.cfg.dec_max_len > c["n_positions"]:
        raise ConfigError(f"{folder / 'config.json'}: dec_max_len={decoder.cfg.dec_max_len} is longer than the "
                          f"language model's n_positions={c['n_positions']}")
    n_text = text_vocab(folder)
    vocab = decoder.embed.weight.shape[0]
    with contextlib.ExitStack() as stack:
        w = checked_weights(folder, stack, _expected(c), _IGNORED, (
            f" (n_layer={c['n_layer']})",
            f" (n_layer={c['n_layer']}, add_cross_attention={c.get('add_cross_attention', False)})",
            f" (n_embd={c['n_embd']}, n_inner={c['n_inner']}, vocab_size={c['vocab_size']}, "
            f"n_positions={c['n_positions']})"))
        where = folder / w.label
        if n_text > c["vocab_size"]:
            raise ConfigError(f"{folder / 'tokenizer.json'} has {n_text} tokens but wte.weight in {where} has "
                              f"{c['vocab_size']} rows (config.json vocab_size): tokenizer and weights do not match")
        if vocab < n_text:
            raise ConfigError(f"vocab_size={vocab} is smaller than {source}'s tokenizer ({n_text} tokens); build "
                              "the config with vqa.weights.language_model.model_preset(..., dec_pretrained=...)")

        def put(param: torch.Tensor, name: str, conv1d: bool = False) -> None:
            t = w.get(name)
            param.copy_((t.t() if conv1d else t).to(param.dtype))

        copy_vocab(decoder.embed.weight, w.get("wte.weight"), n_text)
        decoder.pos.weight.copy_(w.get("wpe.weight")[: decoder.cfg.dec_max_len])
        for i, blk in enumerate(decoder.blocks):
            params = dict(blk.named_parameters())
            for theirs, ours, conv1d in BLOCK_KEYS:
                put(params[ours], f"h.{i}.{theirs}", conv1d)
            # the new cross-attention adds nothing until it has learned something
            blk.cross_attn.proj.weight.zero_()
            blk.cross_attn.proj.bias.zero_()
        put(decoder.ln_f.weight, "ln_f.weight")
        put(decoder.ln_f.bias, "ln_f.bias")
