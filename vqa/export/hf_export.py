"""`vqa export --checkpoint RUN --transformers OUT`: a checkpoint as a `transformers` VisionEncoderDecoderModel
folder (a ViTModel encoder, a GPT2LMHeadModel decoder with cross-attention), which
`VisionEncoderDecoderModel.from_pretrained(OUT)` loads and whose `generate()` gives `vqa caption`'s captions.

Written with transformers' own classes (the `transformers` extra): config.json, model.safetensors (the tied
LM head stored once), generation_config.json (start, end and pad ids, the caption prompt, greedy decoding up
to `vqa caption`'s default budget), preprocessor_config.json (ViTImageProcessor: the model's size, mean, std and
resampling; it squashes to the square, so a model trained on letterboxed images should get square pictures,
or pictures padded to a square, for the same input), the tokenizer (tokenizer.json, tokenizer_config.json),
card.json and the export marker.

What maps (`vqa.weights.hf_layout` has the tensor names):
  - the memory projection (vision.proj) is enc_to_dec_proj when the widths differ; when they match,
    transformers has no projection, and it folds into every cross-attention's key/value weights
    (W_kv P, W_kv b + b_kv; an identity, as an imported model's, is left out as it is);
  - learned positions are wpe; fixed sinusoidal positions are written as the wpe table they are;
  - the embedding scale (x sqrt(width), dec_embed_scale) is an untied head: wte = embedding x scale,
    lm_head = embedding;
  - the caption prompt `<bos> <caption>`: decoder_start_token_id = <bos> and forced_bos_token_id = <caption>
    (the first generated token is forced), so greedy generate() starts as vqa does. (Beam search counts the
    forced token in its length penalty; pass decoder_input_ids=[[bos, caption]] for vqa's beam scores.)
    As vqa's decoding, it never generates a special token but <eos> (bad_words_ids: the tokenizer's
    `never_generated`; the forced <caption> is forced after them) and writes at least one caption token
    (min_new_tokens counts the forced one).
A model transformers cannot express (a convolutional stem, memory positions, QK-norm, a timm model other than
the plain ViT) is refused before anything is written, in one line naming each field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from ..config import CAPTION_TOKENS
from ..errors import ConfigError, ExtraMissing
from ..identity import checkpoint_identity
from ..weights import checkpoint
from ..weights.hf_layout import vqa_to_hf
from .output import MARKER, check_output, export_replacing

ACT = {"gelu": "gelu", "gelu_tanh": "gelu_new"}  # dec_activation -> GPT-2's activation_function


def require_transformers():  # pragma: no mutate block (a check, not the mapping)
    try:
        import transformers
    except ImportError:
        raise ExtraMissing("exporting to transformers", "transformers") from None
    return transformers


def blockers(model) -> list[str]:  # pragma: no mutate block (a check, not the mapping)
    """Why `model` cannot be a VisionEncoderDecoderModel: one entry per field ([] when it can)."""
    cfg, vit = model.cfg, model.vision.vit
    out = [f"{k}=True ({why})" for k, why in (
        ("vit_conv_stem", "ViTModel embeds patches with one convolution"),
        ("vit_qk_norm", "ViTModel has no LayerNorm on queries and keys"),
        ("vit_memory_pos", "VisionEncoderDecoderModel adds no positions to the image tokens"),
        ("dec_qk_norm", "GPT-2 has no LayerNorm on queries and keys")) if getattr(cfg, k) and cfg.dec_layout == "gpt"]
    if cfg.dec_layout == "llama":
        out.append("dec_layout='llama' (VisionEncoderDecoderModel's decoder must hold a cross-attention inside every "
                   "layer, which transformers' Llama, Qwen2 and Qwen3 layers lack; the gated cross-attention blocks "
                   "between layers have no place in that format)")
    if cfg.vit_conv_stem or cfg.vit_qk_norm:
        return out
    odd = []  # what the timm model named by vit_name has that ViTModel has not
    if type(vit).__name__ != "VisionTransformer":
        odd.append(f"a {type(vit).__name__}")
    else:
        if not vit.has_class_token or vit.num_reg_tokens or vit.no_embed_class or vit.pos_embed is None:
            odd.append("prefix tokens other than one CLS token with its position")
        if not isinstance(vit.norm_pre, nn.Identity) or not isinstance(vit.patch_embed.norm, nn.Identity):
            odd.append("a LayerNorm before the blocks")
        if vit.patch_embed.proj.bias is None or not isinstance(vit.norm, nn.LayerNorm):
            odd.append("a patch embedding without bias or no final LayerNorm")
        blk = vit.blocks[0]
        if not all(isinstance(getattr(blk, n, None), nn.Identity) for n in ("ls1", "ls2")):
            odd.append("layer scale")
        if getattr(blk.attn, "qkv", None) is None or blk.attn.qkv.bias is None or not isinstance(
                getattr(blk.attn, "norm", nn.Identity()), nn.Identity):
            odd.append("attention other than a fused qkv with bias")
        act = getattr(blk.mlp, "act", None)
        if not (isinstance(act, nn.GELU) and act.approximate == "none") or not hasattr(blk.mlp, "fc1"):
            odd.append("an MLP other than Linear-GELU-Linear")
        if getattr(vit, "dynamic_img_size", False):
            odd.append("dynamic image sizes")
    if odd:
        out.append(f"vit_name={cfg.vit_name!r} (timm builds it with {', '.join(odd)}; ViTModel has none)")
    return out


def hf_configs(model, tok) -> tuple[dict, dict]:
    """(ViTConfig, GPT2Config) keyword arguments of `model`."""
    cfg, vit = model.cfg, model.vision.vit
    blk = vit.blocks[0]
    enc = dict(hidden_size=vit.embed_dim, num_hidden_layers=len(vit.blocks), num_attention_heads=blk.attn.num_heads,
               intermediate_size=blk.mlp.fc1.out_features, hidden_act="gelu", layer_norm_eps=float(vit.norm.eps),
               image_size=cfg.vit_image_size, patch_size=cfg.vit_patch_size, num_channels=3, qkv_bias=True,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    d = cfg.dec_width
    dec = dict(vocab_size=cfg.vocab_size, n_positions=cfg.dec_max_len, n_embd=d, n_layer=cfg.dec_depth,
               n_head=cfg.dec_heads, n_inner=model.decoder.blocks[0].mlp[0].out_features,
               activation_function=ACT[cfg.dec_activation], layer_norm_epsilon=cfg.dec_norm_eps,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, add_cross_attention=True, is_decoder=True,
               bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
               tie_word_embeddings=not cfg.dec_embed_scale)
    return enc, dec


@torch.no_grad()
def hf_tensors(model) -> dict[str, torch.Tensor]:
    """The VisionEncoderDecoder tensors of `model` (float32), the memory projection folded where needed."""
    cfg = model.cfg
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    if cfg.dec_positions != "learned":
        state["decoder.pos.weight"] = model.decoder.pe.float()  # the fixed table, as a learned one
    project = model.vision.vit.embed_dim != cfg.dec_width
    if not project:
        w, b = state["vision.proj.weight"], state["vision.proj.bias"]
        if not (torch.equal(w, torch.eye(w.shape[0])) and not b.any()):
            for i in range(cfg.dec_depth):
                kw, kb = f"decoder.blocks.{i}.cross_attn.kv.weight", f"decoder.blocks.{i}.cross_attn.kv.bias"
                wkv = state[kw].double()
                state[kw] = (wkv @ w.double()).float()  # kv(P m + b) = (W_kv P) m + (W_kv b + b_kv)
                state[kb] = (wkv @ b.double() + state[kb].double()).float()
    out = vqa_to_hf(state, len(model.vision.vit.blocks), cfg.dec_depth, project)
    if cfg.dec_embed_scale:  # the scale on the input side only: the head reads the embedding unscaled
        emb = state["decoder.embed.weight"]
        out["decoder.transformer.wte.weight"] = emb * model.decoder.embed_scale
        out["decoder.lm_head.weight"] = emb.clone()  # untied (else: tied to wte, stored once)
    return out


def export_transformers(checkpoint_path: str | Path, out: str | Path) -> Path:  # pragma: no mutate block (I/O)
    """Write the VisionEncoderDecoderModel folder of a checkpoint (or run folder) into `out`: the tensors in
    the file layout every transformers version reads (the one `save_pretrained` writes), the configs by
    transformers' own classes."""
    require_transformers()
    from safetensors.torch import save_file
    from transformers import (
        GenerationConfig,
        GPT2Config,
        PreTrainedTokenizerFast,
        VisionEncoderDecoderConfig,
        ViTConfig,
        ViTImageProcessor,
    )

    model, tok, card = checkpoint.load(checkpoint_path)
    model = model.float().eval()
    problems = blockers(model)
    if problems:
        raise ConfigError(f"{checkpoint_path} cannot be written as a transformers VisionEncoderDecoderModel: "
                          + "; ".join(problems))
    enc, dec = hf_configs(model, tok)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(ViTConfig(**enc), GPT2Config(**dec))
    config.decoder_start_token_id, config.pad_token_id = tok.bos_id, tok.pad_id  # what training with labels needs
    config.architectures = ["VisionEncoderDecoderModel"]
    tensors = hf_tensors(model)
    e = enc["hidden_size"]  # ViTModel's pooler, which the decoder never reads: zeros rather than missing
    tensors["encoder.pooler.dense.weight"], tensors["encoder.pooler.dense.bias"] = torch.zeros(e, e), torch.zeros(e)
    prompt = tok.caption_prompt()
    generation = GenerationConfig(
        decoder_start_token_id=tok.bos_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
        forced_bos_token_id=prompt[1] if len(prompt) > 1 else None,
        max_length=min(model.cfg.dec_max_len, len(prompt) + CAPTION_TOKENS),  # vqa caption's default budget
        min_new_tokens=len(prompt), bad_words_ids=[[i] for i in sorted(tok.never_generated)] or None,
        do_sample=False, num_beams=1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    generation.save_pretrained(out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    ViTImageProcessor(do_resize=True, size={"height": model.cfg.vit_image_size, "width": model.cfg.vit_image_size},
                      resample={"bilinear": 2, "bicubic": 3}[model.cfg.vit_resample], do_rescale=True,
                      do_normalize=True, image_mean=list(model.cfg.vit_mean),
                      image_std=list(model.cfg.vit_std)).save_pretrained(out)
    specials = {k: tok.id_to_token(i) for k, i in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id),
                                                   ("pad_token", tok.pad_id), ("unk_token", tok.unk_id))}
    PreTrainedTokenizerFast(tokenizer_object=tok.hf, **specials).save_pretrained(out)
    (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
    (out / MARKER).write_text(json.dumps(dict(written_by="vqa export --transformers",
                                              checkpoint=str(checkpoint_path),
                                              model=checkpoint_identity(checkpoint.resolve(checkpoint_path)))) + "\n")
    return out


def run(args) -> int:  # pragma: no mutate block (the CLI, not the mapping)
    require_transformers()  # the one-line message before any work
    check_output(args.checkpoint, args.transformers, args.force, flag="--transformers")
    model, _, _ = checkpoint.load(args.checkpoint)
    problems = blockers(model)  # before anything is written
    if problems:
        raise ConfigError(f"{args.checkpoint} cannot be written as a transformers VisionEncoderDecoderModel: "
                          + "; ".join(problems))
    out = export_replacing(args.checkpoint, args.transformers, args.force, writer=export_transformers,
                           flag="--transformers")
    cfg = json.loads((out / "preprocessor_config.json").read_text())
    print(f"exported {args.checkpoint} to {out}: VisionEncoderDecoderModel.from_pretrained({str(out)!r}); "
          f"ViTImageProcessor.from_pretrained(...) squashes pictures to {cfg['size']['height']} px", file=sys.stderr)
    if model.cfg.vit_resize == "letterbox":
        print("vqa export: note: the model was trained on letterboxed pictures and ViTImageProcessor squashes them: "
              "give it square pictures (or pad them to a square) for the input vqa gives the model", file=sys.stderr)
    return 0


__all__ = ["export_transformers", "blockers", "hf_tensors", "hf_configs", "require_transformers"]
