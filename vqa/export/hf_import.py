"""`vqa import --transformers DIR --out RUN`: a Hugging Face VisionEncoderDecoderModel folder (a ViTModel
encoder, a GPT2LMHeadModel decoder with cross-attention; e.g. nlpconnect/vit-gpt2-image-captioning) as a
checkpoint folder every vqa command reads (`vqa caption`, `vqa eval`, `vqa train --init-from`, the app).

Read: config.json (the encoder and decoder sub-configs, the start / end token ids; generation_config.json
fills ids config.json leaves out), model.safetensors (or pytorch_model.bin, only through
`torch.load(weights_only=True)`), preprocessor_config.json (size, mean, std, resampling: the model keeps the
squash-to-square resize it was trained with), and the GPT-2 tokenizer (tokenizer.json, or vocab.json +
merges.txt). `transformers` is not needed. The tensors map one to one (`vqa.weights.hf_layout`); no weight
changes, so exporting the run again (`vqa export --transformers`) gives the source tensors back.

The imported model captions as it was trained: from its decoder_start_token_id alone, without vqa's prompt
tokens (its tokenizer has only GPT-2's <|endoftext|>: `vqa.tokenizer.LM_END`). Fine-tuning it with
`vqa train --init-from RUN` adds <question> and <answer> (`vqa.weights.grow_vocab`).

Every check runs before anything is written; a bad folder gets one line naming the file and the field.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..config import GPT2_DECODER, ModelConfig
from ..errors import CheckpointError, ConfigError
from ..json_object import read_object
from ..model import VQAModel
from ..tokenizer import LM_END, Tokenizer, read_tokenizer_json
from ..weights import checkpoint
from ..weights.gpt2 import architecture, check_config
from ..weights.hf_layout import IGNORED, hf_shapes, hf_to_vqa

# transformers' ViTConfig defaults, for fields a config.json leaves out
VIT_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                    hidden_act="gelu", layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
                    qkv_bias=True)
RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL's numbers, as preprocessor_config.json stores them
PREPROCESSOR_DEFAULTS = dict(do_resize=True, resample=2, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                             image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])  # ViTImageProcessor's


def _positive_int(c: dict, key: str, where: str) -> int:
    v = c[key]
    if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
        v = v[0]  # a square [h, w]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer, got {c[key]!r}")
    return v


def check_encoder(raw, where: str) -> dict:
    """The ViT sub-config with ViTConfig's defaults, checked against what timm's VisionTransformer computes."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: encoder must be an object (the ViT's config), got {type(raw).__name__}")
    if raw.get("model_type") != "vit":
        raise ConfigError(f"{where}: encoder.model_type {raw.get('model_type')!r} is not supported: vqa imports a "
                          "ViTModel encoder (model_type 'vit')")
    c = {**VIT_DEFAULTS, **raw}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                "patch_size", "num_channels"):
        c[key] = _positive_int(c, key, f"{where}: encoder")
    wrong = [(k, c[k], want) for k, want in (("hidden_act", "gelu"), ("qkv_bias", True), ("num_channels", 3))
             if c[k] != want]
    if wrong:
        k, got, want = wrong[0]
        raise ConfigError(f"{where}: encoder.{k}={got!r} is not supported (timm's ViT has {k}={want!r})")
    if not isinstance(c["layer_norm_eps"], (int, float)) or not c["layer_norm_eps"] > 0:
        raise ConfigError(f"{where}: encoder.layer_norm_eps must be a positive number, got {c['layer_norm_eps']!r}")
    if c["hidden_size"] % c["num_attention_heads"]:
        raise ConfigError(f"{where}: encoder.hidden_size={c['hidden_size']} is not divisible by "
                          f"num_attention_heads={c['num_attention_heads']}")
    if c["image_size"] % c["patch_size"]:
        raise ConfigError(f"{where}: encoder.image_size={c['image_size']} is not a multiple of "
                          f"patch_size={c['patch_size']}")
    ratio = c["intermediate_size"] / c["hidden_size"]
    if int(c["hidden_size"] * ratio) != c["intermediate_size"]:
        raise ConfigError(f"{where}: encoder.intermediate_size={c['intermediate_size']} is not a width timm's "
                          "mlp_ratio can express")
    c["mlp_ratio"] = ratio
    return c


def check_decoder(raw, where: str) -> dict:
    """The GPT-2 sub-config (`vqa.weights.gpt2.check_config`), which must carry cross-attention."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: decoder must be an object (the GPT-2's config), got {type(raw).__name__}")
    if raw.get("model_type") != "gpt2":
        raise ConfigError(f"{where}: decoder.model_type {raw.get('model_type')!r} is not supported: vqa imports a "
                          "GPT2LMHeadModel decoder (model_type 'gpt2') built with add_cross_attention")
    c = check_config(raw, f"{where}: decoder")
    if not c.get("add_cross_attention"):
        raise ConfigError(f"{where}: decoder.add_cross_attention is not true: the GPT-2 has no cross-attention to "
                          "read the image with")
    if c.get("cross_attention_hidden_size") not in (None, c["n_embd"]):
        raise ConfigError(f"{where}: decoder.cross_attention_hidden_size={c['cross_attention_hidden_size']!r} is not "
                          "supported (the image tokens must reach the decoder at its width, n_embd)")
    return c


def read_preprocessor(folder: Path, image_size: int) -> dict:
    """ModelConfig's image fields from preprocessor_config.json (ViTImageProcessor's defaults where absent)."""
    path = folder / "preprocessor_config.json"
    raw = read_object(path, ConfigError) if path.is_file() else {}
    c = {**PREPROCESSOR_DEFAULTS, **raw}
    size = c.get("size", image_size)
    if isinstance(size, dict):
        size = (size.get("height"), size.get("width")) if "height" in size else (size.get("shortest_edge"),) * 2
    else:
        size = (size, size)
    if tuple(size) != (image_size, image_size):
        raise ConfigError(f"{path}: size {c.get('size')!r} differs from the encoder's image_size={image_size}")
    for key, want in (("do_resize", True), ("do_rescale", True), ("do_center_crop", False)):
        if key in c and bool(c[key]) != want:
            raise ConfigError(f"{path}: {key}={c[key]!r} is not supported (vqa squashes every image to "
                              f"{image_size} px, scales to 0..1 and normalizes)")
    if abs(float(c["rescale_factor"]) * 255 - 1) > 1e-6:
        raise ConfigError(f"{path}: rescale_factor={c['rescale_factor']!r} is not 1/255")
    if c["resample"] not in RESAMPLE:
        raise ConfigError(f"{path}: resample={c['resample']!r} is not supported (2: bilinear, 3: bicubic)")
    mean, std = (c["image_mean"], c["image_std"]) if c["do_normalize"] else ([0.0] * 3, [1.0] * 3)
    stats = {}
    for key, v in (("image_mean", mean), ("image_std", std)):
        v = [v] * 3 if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)):
            raise ConfigError(f"{path}: {key} must be 3 numbers, got {v!r}")
        stats[key] = tuple(float(x) for x in v)
    if not all(s > 0 for s in stats["image_std"]):
        raise ConfigError(f"{path}: image_std must be positive, got {list(stats['image_std'])!r}")
    return dict(vit_mean=stats["image_mean"], vit_std=stats["image_std"], vit_resize="squash",
                vit_resample=RESAMPLE[c["resample"]])


def read_tokenizer(folder: Path) -> Tokenizer:
    """The GPT-2 tokenizer: tokenizer.json, else vocab.json + merges.txt (byte-level BPE, as GPT2TokenizerFast)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    if (folder / "tokenizer.json").is_file():
        hf = read_tokenizer_json(folder / "tokenizer.json")
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        try:
            hf = HFTokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
        except Exception as e:  # tokenizers raises a bare Exception
            raise ConfigError(f"{folder / 'vocab.json'}: not a GPT-2 vocabulary with merges.txt ({e})") from None
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.post_processor = processors.ByteLevel(trim_offsets=False)
        if hf.token_to_id(LM_END) is not None:
            hf.add_special_tokens([AddedToken(LM_END, special=True, normalized=False)])
    else:
        raise ConfigError(f"{folder / 'tokenizer.json'}: missing (nor vocab.json + merges.txt): the GPT-2 "
                          "tokenizer is needed")
    try:
        return Tokenizer(hf)
    except ConfigError:
        raise ConfigError(f"{folder}: the tokenizer has neither GPT-2's {LM_END} nor vqa's special tokens") from None


def token_ids(folder: Path, top: dict, dec: dict, tok: Tokenizer) -> dict:
    """decoder_start / eos ids (config.json, else its decoder, else generation_config.json), which must be
    the tokenizer's start and end tokens."""
    gen_path = folder / "generation_config.json"
    gen = read_object(gen_path, ConfigError) if gen_path.is_file() else {}
    where = folder / "config.json"
    out = {}
    for key, role, ours in (("decoder_start_token_id", "start", tok.bos_id), ("eos_token_id", "end", tok.eos_id)):
        value = next((d[key] for d in (top, dec, gen) if d.get(key) is not None), None)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if value != ours:
            raise ConfigError(f"{where}: {key}={value!r} is not the tokenizer's {role} token "
                              f"({tok.id_to_token(ours)!r}, id {ours})")
        out[key] = value
    return out


class _Tensors:
    """The weights of model.safetensors, or of pytorch_model.bin read with weights_only=True."""

    def __init__(self, folder: Path):
        safetensors_path, bin_path = folder / "model.safetensors", folder / "pytorch_model.bin"
        if safetensors_path.is_file():
            from safetensors import safe_open

            self.path = safetensors_path
            try:
                with safe_open(str(safetensors_path), framework="pt") as f:
                    self.shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            except Exception as e:  # safetensors' own error type for a bad or truncated header
                raise ConfigError(f"{safetensors_path}: not a readable safetensors file "
                                  f"({str(e).splitlines()[0][:200]})") from None
            self._tensors = None
        elif bin_path.is_file():
            self.path = bin_path
            try:
                self._tensors = torch.load(bin_path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # pickle's and torch's many errors; weights_only refuses code
                raise ConfigError(f"{bin_path}: not a readable weights file ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:200]})") from None
            if not isinstance(self._tensors, dict):
                raise ConfigError(f"{bin_path}: expected a dict of tensors, "
                                  f"got {type(self._tensors).__name__}")
            self.shapes = {k: tuple(v.shape) for k, v in self._tensors.items() if torch.is_tensor(v)}
        else:
            raise ConfigError(f"{safetensors_path}: missing (nor pytorch_model.bin): no weights in {folder}")

    def load(self, names) -> dict[str, torch.Tensor]:
        if self._tensors is not None:
            return {k: self._tensors[k] for k in names}
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in names}
        except Exception as e:
            raise ConfigError(f"{self.path}: cannot read its tensors ({str(e).splitlines()[0][:200]})") from None


def read_source(folder: str | Path) -> tuple[ModelConfig, dict, Tokenizer]:
    """(ModelConfig, VQAModel state dict, tokenizer) of a VisionEncoderDecoder folder, every check done."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"--transformers {folder}: no such folder")
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: missing: not a transformers model folder")
    top = read_object(path, ConfigError)
    if top.get("model_type") != "vision-encoder-decoder":
        raise ConfigError(f"{path}: model_type {top.get('model_type')!r} is not a VisionEncoderDecoderModel "
                          "(model_type 'vision-encoder-decoder')")
    enc, dec = check_encoder(top.get("encoder"), str(path)), check_decoder(top.get("decoder"), str(path))
    image = read_preprocessor(folder, enc["image_size"])
    tok = read_tokenizer(folder)
    token_ids(folder, top, dec, tok)
    if tok.vocab_size != dec["vocab_size"]:
        raise ConfigError(f"{path}: decoder.vocab_size={dec['vocab_size']} but the tokenizer has {tok.vocab_size} "
                          "tokens: they must match")
    w = _Tensors(folder)
    expected = hf_shapes(enc, dec, dec["vocab_size"])
    missing = [k for k in expected if k not in w.shapes]
    if missing:
        raise ConfigError(f"{w.path}: lacks {missing[0]}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}"
                          f", which config.json describes (encoder.num_hidden_layers={enc['num_hidden_layers']}, "
                          f"decoder.n_layer={dec['n_layer']})")
    extra = [k for k in w.shapes if k not in expected and not IGNORED.fullmatch(k)]
    if extra:
        raise ConfigError(f"{w.path}: holds {extra[0]}{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}, "
                          "which config.json does not describe")
    for k, shape in expected.items():
        if w.shapes[k] != shape:
            raise ConfigError(f"{w.path}: {k} is {list(w.shapes[k])}, but config.json implies {list(shape)}")
    tensors = {k: v.float() for k, v in w.load(list(expected) + [k for k in ("decoder.lm_head.weight",)
                                                                   if k in w.shapes]).items()}
    head = tensors.pop("decoder.lm_head.weight", None)
    if head is not None and not torch.equal(head, tensors["decoder.transformer.wte.weight"]):
        raise ConfigError(f"{w.path}: decoder.lm_head.weight differs from decoder.transformer.wte.weight: vqa's "
                          "LM head is tied to the token embedding")
    cfg = ModelConfig(
        vit_name="vit_base_patch16_224", vit_image_size=enc["image_size"], vit_patch_size=enc["patch_size"],
        vit_width=enc["hidden_size"], vit_depth=enc["num_hidden_layers"], vit_heads=enc["num_attention_heads"],
        vit_mlp_ratio=enc["mlp_ratio"], vit_norm_eps=float(enc["layer_norm_eps"]), **image,
        **{**GPT2_DECODER, **architecture(dec)}, dec_max_len=dec["n_positions"], **tok.model_ids())
    return cfg, hf_to_vqa(tensors, enc["num_hidden_layers"], dec["n_layer"], dec["n_embd"]), tok


def import_transformers(source: str | Path, out: str | Path) -> Path:
    """Write the checkpoint folder `out` from the VisionEncoderDecoder folder `source` (nothing is written
    when a check fails)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder; choose another")
    try:
        cfg, state, tok = read_source(source)
    except ConfigError as e:  # a missing or bad folder is a bad file (exit status 1), not a usage error
        raise CheckpointError(str(e)) from None
    model = VQAModel(cfg)
    model.load_state_dict(state, strict=True)
    card = dict(imported_from=str(Path(source).resolve()), source="transformers VisionEncoderDecoderModel",
                tasks=["caption"])
    return checkpoint.save(out, model.eval(), tok, card)


def run(args) -> int:
    out = import_transformers(args.transformers, args.out)
    print(f"imported {args.transformers} into {out}: caption with `vqa caption --checkpoint {out} IMAGE`, "
          f"fine-tune with `vqa train --init-from {out} --data DIR --out RUN`", file=sys.stderr)
    return 0


__all__ = ["import_transformers", "read_source"]
