"""`vqa export --checkpoint RUN --onnx OUT_DIR`: the model as two ONNX graphs for onnxruntime.

    encoder.onnx       images [B, 3, S, S] (normalized) -> memory_k, memory_v [L, B, H, N, Dh]: every decoder
                       layer's cross-attention keys and values of the image, computed once per image
    decoder_step.onnx  input_ids [B, T], position_ids [B, T], key_mask [B, P + T] (True: a real key),
                       past_k, past_v [L, B, H, P, Dh], memory_k, memory_v
                       -> logits [B, T, V], present_k, present_v [L, B, H, P + T, Dh]
    tokenizer.json, config.json (the model's, plus an "onnx" section naming the graphs and the special ids),
    card.json

One decoder graph serves the prompt (P = 0, T = prompt length) and every new token (T = 1): the graph is the
model's own decoder forward with a concatenating cache, exported with torch.export (dynamic batch, new tokens
and past length), under the mask the eager decoding builds (`vqa.model.masks.causal_mask`). `vqa.export.runtime` runs
them with onnxruntime and greedy decoding; onnx, onnxscript and onnxruntime are the optional extra `vqa[onnx]`.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError, ExtraMissing
from ..identity import checkpoint_identity
from ..model.masks import causal_mask
from . import output
from .output import MARKER, _check_apart, check_output  # noqa: F401 (vqa.export.onnx's API)

ENCODER, DECODER = "encoder.onnx", "decoder_step.onnx"
STEP_INPUTS = ("input_ids", "position_ids", "key_mask", "past_k", "past_v", "memory_k", "memory_v")
STEP_OUTPUTS = ("logits", "present_k", "present_v")


class _ConcatCache:
    """The self-attention cache interface (`len`, `append`, as vqa.model.attention.StaticKVCache) over tensors
    joined by concatenation: what an exported graph can hold, where the preallocated in-place cache cannot."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v, self.len = k, v, k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)  # [B, H, P + T, Dh]
        self.len = self.k.shape[2]
        return self.k, self.v


class EncoderGraph(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.model.decoder.memory_kv(self.model.encode(images))  # L x 2 x [B, H, N, Dh]
        return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])  # [L, B, H, N, Dh] each


class DecoderStepGraph(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, key_mask, past_k, past_v, memory_k, memory_v):
        t, p = input_ids.shape[1], past_k.shape[3]
        caches = [_ConcatCache(past_k[i], past_v[i]) for i in range(past_k.shape[0])]
        mask = causal_mask(t, p + t, input_ids.device, key_mask)  # [B, 1, T, P + T], as the eager prefill's
        kv = [(memory_k[i], memory_v[i]) for i in range(memory_k.shape[0])]
        hidden, _ = self.model.decoder(input_ids, kv, pos=position_ids, mask=mask, caches=caches)
        logits = self.model.decoder.logits(hidden)  # [B, T, V]
        return logits, torch.stack([c.k for c in caches]), torch.stack([c.v for c in caches])


def example_inputs(model, batch: int = 2, new: int = 3, past: int = 4) -> dict[str, torch.Tensor]:
    """Inputs of the right shapes for the decoder step (tracing and tests)."""
    c = model.cfg
    layers, heads, dh = c.dec_depth, c.dec_heads, c.dec_width // c.dec_heads
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        mk, mv = EncoderGraph(model)(torch.randn(batch, 3, c.vit_image_size, c.vit_image_size, generator=g))
    return dict(
        input_ids=torch.randint(3, c.vocab_size, (batch, new), generator=g),
        position_ids=torch.arange(past, past + new).expand(batch, new).contiguous(),
        key_mask=torch.ones(batch, past + new, dtype=torch.bool),
        past_k=torch.randn(layers, batch, heads, past, dh, generator=g),
        past_v=torch.randn(layers, batch, heads, past, dh, generator=g),
        memory_k=mk, memory_v=mv,
    )


def export_onnx(checkpoint_path: str | Path, out: str | Path, quiet: bool = True) -> Path:
    """Write the two graphs, the tokenizer and the configs of a checkpoint (or run folder) into `out`."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ExtraMissing("exporting to ONNX", "onnx", e.name) from None
    from ..weights import checkpoint

    _check_apart(checkpoint_path, out)
    model, tok, card = checkpoint.load(checkpoint_path)
    if model.cfg.dec_layout != "gpt":
        raise ConfigError(f"{checkpoint_path}: dec_layout={model.cfg.dec_layout!r} cannot be exported to ONNX: the "
                          "graphs and vqa's ONNX runtime hold one cross-attention per layer and dec_heads key/value "
                          "heads, not gated blocks between layers and grouped-query caches")
    model = model.float().eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    batch, new, past = torch.export.Dim("batch"), torch.export.Dim("new"), torch.export.Dim("past")
    s = model.cfg.vit_image_size
    images = torch.zeros(2, 3, s, s)
    step_dyn = {"input_ids": {0: batch, 1: new}, "position_ids": {0: batch, 1: new},
                "key_mask": {0: batch, 1: torch.export.Dim.AUTO}, "past_k": {1: batch, 3: past},
                "past_v": {1: batch, 3: past}, "memory_k": {1: batch}, "memory_v": {1: batch}}
    # the exporter prints its progress on stdout; a CLI wants one line
    quietly = contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext()
    with torch.no_grad(), warnings.catch_warnings(), quietly:
        warnings.simplefilter("ignore")
        torch.onnx.export(EncoderGraph(model), (images,), str(out / ENCODER), input_names=["images"],
                          output_names=["memory_k", "memory_v"], dynamic_shapes={"images": {0: batch}}, dynamo=True)
        inputs = example_inputs(model)
        torch.onnx.export(DecoderStepGraph(model), tuple(inputs.values()), str(out / DECODER),
                          input_names=list(STEP_INPUTS), output_names=list(STEP_OUTPUTS), dynamic_shapes=step_dyn,
                          dynamo=True)
    tok.save(out / "tokenizer.json")
    config = model.cfg.to_dict()
    config["onnx"] = dict(encoder=ENCODER, decoder_step=DECODER, step_inputs=list(STEP_INPUTS),
                          step_outputs=list(STEP_OUTPUTS), special_ids=dict(
                              pad=tok.pad_id, bos=tok.bos_id, eos=tok.eos_id, question=tok.question_id,
                              answer=tok.answer_id, caption=tok.caption_id))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "card.json").write_text(json.dumps(card, indent=2, default=str) + "\n")
    for leftover in out.glob("*.onnx.data"):  # small models fit in the .onnx file itself
        if leftover.stat().st_size == 0:
            leftover.unlink()
    (out / MARKER).write_text(json.dumps(dict(written_by="vqa export", checkpoint=str(checkpoint_path),
                                              model=checkpoint_identity(checkpoint.resolve(checkpoint_path)))) + "\n")
    return out


def export_replacing(checkpoint_path: str | Path, out: str | Path, force: bool = False) -> Path:
    """`export_onnx` into a temporary sibling of `out`, swapped in only once it succeeded (`vqa.export.output`)."""
    return output.export_replacing(checkpoint_path, out, force, export_onnx, "--onnx")


def run(args) -> int:
    """`vqa export --onnx OUT_DIR` (vqa.export.cli has the flags)."""
    out = export_replacing(args.checkpoint, args.onnx, args.force)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"exported {args.checkpoint} to {out} ({size:.1f} MiB): {ENCODER}, {DECODER}, tokenizer.json, config.json;"
          f" run it with `python -m vqa.export.runtime {out} IMAGE [QUESTION]`", file=sys.stderr)
    return 0


__all__ = ["export_onnx", "export_replacing", "check_output", "MARKER", "EncoderGraph", "DecoderStepGraph",
           "example_inputs", "STEP_INPUTS", "STEP_OUTPUTS"]
