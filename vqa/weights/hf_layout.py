"""The Hugging Face VisionEncoderDecoder layout (a ViTModel encoder, a GPT2LMHeadModel decoder built with
add_cross_attention) and this project's VQAModel: the tensor names both ways, used by `vqa import` and
`vqa export --transformers`. The decoder's names are `vqa.weights.gpt2`'s (BLOCK_KEYS, CROSS_KEYS).

VIT_TOP, VIT_BLOCK (under encoder.encoder.layer.i. and vision.vit.blocks.i.), DEC_TOP and PROJ pair the names;
ViT's separate query, key, value (QKV) stack into timm's fused qkv; the pooler is ignored (the decoder reads
every token), and enc_to_dec_proj is absent (the identity) when the widths match.
"""

from __future__ import annotations

import re

import torch

from .gpt2 import BLOCK_KEYS, CROSS_KEYS, block_shapes

VIT_TOP = (
    ("encoder.embeddings.cls_token", "vision.vit.cls_token"),
    ("encoder.embeddings.position_embeddings", "vision.vit.pos_embed"),
    ("encoder.embeddings.patch_embeddings.projection.weight", "vision.vit.patch_embed.proj.weight"),
    ("encoder.embeddings.patch_embeddings.projection.bias", "vision.vit.patch_embed.proj.bias"),
    ("encoder.layernorm.weight", "vision.vit.norm.weight"),
    ("encoder.layernorm.bias", "vision.vit.norm.bias"),
)
VIT_BLOCK = (  # under encoder.encoder.layer.i. and vision.vit.blocks.i.
    ("layernorm_before.weight", "norm1.weight"), ("layernorm_before.bias", "norm1.bias"),
    ("attention.output.dense.weight", "attn.proj.weight"), ("attention.output.dense.bias", "attn.proj.bias"),
    ("layernorm_after.weight", "norm2.weight"), ("layernorm_after.bias", "norm2.bias"),
    ("intermediate.dense.weight", "mlp.fc1.weight"), ("intermediate.dense.bias", "mlp.fc1.bias"),
    ("output.dense.weight", "mlp.fc2.weight"), ("output.dense.bias", "mlp.fc2.bias"),
)
QKV = ("query", "key", "value")  # ViT's separate projections, stacked in this order into timm's fused qkv
DEC_TOP = (
    ("decoder.transformer.wte.weight", "decoder.embed.weight"),
    ("decoder.transformer.wpe.weight", "decoder.pos.weight"),
    ("decoder.transformer.ln_f.weight", "decoder.ln_f.weight"),
    ("decoder.transformer.ln_f.bias", "decoder.ln_f.bias"),
)
PROJ = (("enc_to_dec_proj.weight", "vision.proj.weight"), ("enc_to_dec_proj.bias", "vision.proj.bias"))
# in a VisionEncoderDecoder file and not in a VQAModel: the pooler, the causal-mask buffers of old .bin files,
# the tied LM head (re-tied to wte), ViT's mask token
IGNORED = re.compile(r"encoder\.pooler\..*|decoder\.transformer\.h\.\d+\.(attn|crossattention)\.(bias|masked_bias)"
                     r"|decoder\.lm_head\.weight|encoder\.embeddings\.mask_token")


def hf_shapes(enc: dict, dec: dict, vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor a VisionEncoderDecoder of these (checked) sub-configs holds, with its shape."""
    e, p, d, h = enc["hidden_size"], enc["patch_size"], dec["n_embd"], dec["hidden"]
    n = (enc["image_size"] // p) ** 2 + 1
    out = {"encoder.embeddings.cls_token": (1, 1, e), "encoder.embeddings.position_embeddings": (1, n, e),
           "encoder.embeddings.patch_embeddings.projection.weight": (e, enc["num_channels"], p, p),
           "encoder.embeddings.patch_embeddings.projection.bias": (e,),
           "encoder.layernorm.weight": (e,), "encoder.layernorm.bias": (e,)}
    m = enc["intermediate_size"]
    for i in range(enc["num_hidden_layers"]):
        pre = f"encoder.encoder.layer.{i}."
        for name in QKV:
            out[f"{pre}attention.attention.{name}.weight"], out[f"{pre}attention.attention.{name}.bias"] = (e, e), (e,)
        out.update({pre + "attention.output.dense.weight": (e, e), pre + "attention.output.dense.bias": (e,),
                    pre + "layernorm_before.weight": (e,), pre + "layernorm_before.bias": (e,),
                    pre + "layernorm_after.weight": (e,), pre + "layernorm_after.bias": (e,),
                    pre + "intermediate.dense.weight": (m, e), pre + "intermediate.dense.bias": (m,),
                    pre + "output.dense.weight": (e, m), pre + "output.dense.bias": (e,)})
    out.update({"decoder.transformer.wte.weight": (vocab, d), "decoder.transformer.wpe.weight": (dec["n_positions"], d),
                "decoder.transformer.ln_f.weight": (d,), "decoder.transformer.ln_f.bias": (d,)})
    for i in range(dec["n_layer"]):
        pre = f"decoder.transformer.h.{i}."
        out.update({pre + k: s for k, s in block_shapes(d, h, cross=True).items()})
    if e != d:
        out.update({"enc_to_dec_proj.weight": (d, e), "enc_to_dec_proj.bias": (d,)})
    return out


def _pairs(vit_depth: int, dec_depth: int):
    """(HF name, vqa name, whether a Conv1D weight, transposed) of every tensor that maps one to one."""
    for theirs, ours in VIT_TOP + DEC_TOP:
        yield theirs, ours, False
    for i in range(vit_depth):
        for theirs, ours in VIT_BLOCK:
            yield f"encoder.encoder.layer.{i}.{theirs}", f"vision.vit.blocks.{i}.{ours}", False
    for i in range(dec_depth):
        for theirs, ours, conv1d in BLOCK_KEYS + CROSS_KEYS:
            yield f"decoder.transformer.h.{i}.{theirs}", f"decoder.blocks.{i}.{ours}", conv1d


def hf_to_vqa(t: dict[str, torch.Tensor], vit_depth: int, dec_depth: int, dec_width: int) -> dict[str, torch.Tensor]:
    """A VQAModel state dict from the tensors of a VisionEncoderDecoder file (checked against `hf_shapes`)."""
    out = {ours: t[theirs].t() if conv1d else t[theirs] for theirs, ours, conv1d in _pairs(vit_depth, dec_depth)}
    for i in range(vit_depth):
        pre, blk = f"encoder.encoder.layer.{i}.", f"vision.vit.blocks.{i}."
        for part in ("weight", "bias"):
            out[f"{blk}attn.qkv.{part}"] = torch.cat([t[f"{pre}attention.attention.{n}.{part}"] for n in QKV])
    if "enc_to_dec_proj.weight" in t:
        out.update({ours: t[theirs] for theirs, ours in PROJ})
    else:  # the same width: the encoder's tokens go to the cross-attention as they are
        out["vision.proj.weight"] = torch.eye(dec_width, dtype=t["decoder.transformer.wte.weight"].dtype)
        out["vision.proj.bias"] = torch.zeros(dec_width, dtype=out["vision.proj.weight"].dtype)
    return {k: v.contiguous() for k, v in out.items()}


def vqa_to_hf(state: dict[str, torch.Tensor], vit_depth: int, dec_depth: int,
              project: bool) -> dict[str, torch.Tensor]:
    """The tensors of a VisionEncoderDecoder file from a VQAModel state dict (`hf_to_vqa` backwards). With
    `project` (the widths differ) vision.proj becomes enc_to_dec_proj; without, the caller has folded it into
    each cross-attention's key/value projection already and it is left out."""
    out = {theirs: state[ours].t() if conv1d else state[ours] for theirs, ours, conv1d in _pairs(vit_depth, dec_depth)}
    for i in range(vit_depth):
        pre, blk = f"encoder.encoder.layer.{i}.", f"vision.vit.blocks.{i}."
        for part in ("weight", "bias"):
            for name, chunk in zip(QKV, state[f"{blk}attn.qkv.{part}"].chunk(3), strict=True):
                out[f"{pre}attention.attention.{name}.{part}"] = chunk
    if project:
        out.update({theirs: state[ours] for theirs, ours in PROJ})
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


__all__ = ["hf_shapes", "hf_to_vqa", "vqa_to_hf", "IGNORED", "QKV"]
