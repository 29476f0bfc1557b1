"""Answers and captions from an exported model (`vqa export`) with onnxruntime alone: no torch at run time.

    python -m vqa.export.runtime OUT_DIR IMAGE "what color is the circle?"     # an answer
    python -m vqa.export.runtime OUT_DIR IMAGE                                 # a caption

    from vqa.export.runtime import OnnxPredictor
    p = OnnxPredictor("exported/")
    p.answer("photo.jpg", "how many circles are there?")

Greedy decoding, batched with left padding exactly as `vqa.decoding.generate` does it (positions count real
tokens, padding keys are masked, each prompt has its own length budget), never producing a special token but
<eos> (the tokenizer's `never_generated`: their logits are -inf) and, for answers and captions, at least one
token before <eos>, so the answers equal the Predictor's greedy ones. Images are prepared as the model saw
them in training: `vqa.data.preprocess.model_picture` with the model's preprocessing (it imports no torch),
then normalized.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ANSWER_TOKENS
from ..data.preprocess import Preprocess, model_picture
from ..errors import CheckpointError, InputError
from ..tokenizer import Tokenizer


class OnnxPredictor:
    def __init__(self, folder: str | Path, providers: list[str] | None = None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise CheckpointError("running ONNX graphs needs onnxruntime: pip install onnxruntime") from None
        folder = Path(folder)
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"{folder}: no config.json; is it a folder written by `vqa export`?")
        self.cfg = json.loads(cfg_path.read_text())
        spec = self.cfg.get("onnx")
        if not isinstance(spec, dict):
            raise CheckpointError(f"{cfg_path}: no 'onnx' section; it was not written by `vqa export`")
        for name in (spec["encoder"], spec["decoder_step"], "tokenizer.json"):
            if not (folder / name).is_file():
                raise CheckpointError(f"{folder} is missing {name}; export the model again with `vqa export`")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        providers = providers or ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(folder / spec["encoder"]), opts, providers=providers)
        self.decoder = ort.InferenceSession(str(folder / spec["decoder_step"]), opts, providers=providers)
        self.tokenizer = Tokenizer.load(folder / "tokenizer.json")
        self.size = int(self.cfg["vit_image_size"])
        self.mean = np.asarray(self.cfg["vit_mean"], dtype=np.float32)[:, None, None]
        self.std = np.asarray(self.cfg["vit_std"], dtype=np.float32)[:, None, None]
        self.pre = Preprocess.of(self.size, self.cfg["vit_mean"], self.cfg["vit_std"],
                                 self.cfg.get("vit_resize", "letterbox"), self.cfg.get("vit_resample", "bicubic"))
        self.eos = int(spec["special_ids"]["eos"])
        self.pad = int(spec["special_ids"]["pad"])
        self.max_len = int(self.cfg["dec_max_len"])
        self.layers, self.heads = int(self.cfg["dec_depth"]), int(self.cfg["dec_heads"])
        self.head_dim = int(self.cfg["dec_width"]) // self.heads
        self.never_generated = sorted(self.tokenizer.never_generated)  # their logits are -inf at every step

    # ---- inputs ----
    def prepare(self, image: Any) -> np.ndarray:
        """[3, S, S] float32, normalized as in training."""
        x = np.asarray(model_picture(image, self.pre), dtype=np.float32).transpose(2, 0, 1) / 255.0  # [3, S, S]
        return (x - self.mean) / self.std

    def encode(self, images: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Every layer's cross-attention keys and values [L, M, H, N, Dh] of the images."""
        batch = np.stack([self.prepare(i) for i in images]).astype(np.float32)
        return tuple(self.encoder.run(None, {"images": batch}))

    # ---- decoding ----
    def step(self, ids, positions, key_mask, past_k, past_v, memory_k, memory_v):
        """One decoder call: logits [B, T, V] and the caches extended by T positions."""
        return self.decoder.run(None, dict(input_ids=ids, position_ids=positions, key_mask=key_mask,
                                           past_k=past_k, past_v=past_v, memory_k=memory_k, memory_v=memory_v))

    def greedy(self, prompts: list[list[int]], memory_k: np.ndarray, memory_v: np.ndarray,
               max_new_tokens: int | None = None, on_logits=None, min_new_tokens: int = 0,
               banned: list[int] | None = None) -> list[list[int]]:
        """Greedy continuations of `prompts` (row b reads image b of the memory), as `generate` gives them with
        the same `min_new_tokens` (no <eos> before that many tokens) and `banned` tokens (never generated;
        default: the tokenizer's `never_generated`, every special token but <eos>). `on_logits(t, logits)`
        sees each step's next-token logits [B, V] as the model gives them, before any is banned (tests
        compare them with PyTorch's)."""
        banned = self.never_generated if banned is None else list(banned)
        if not prompts or any(not p for p in prompts):
            raise InputError("every prompt needs at least one token (<bos>)")
        b, width = len(prompts), max(len(p) for p in prompts)
        if width >= self.max_len:
            raise InputError(f"prompt of {width} tokens leaves no room to generate (dec_max_len={self.max_len})")
        budget = [self.max_len - len(p) if max_new_tokens is None else min(max_new_tokens, self.max_len - len(p))
                  for p in prompts]
        ids = np.full((b, width), self.pad, dtype=np.int64)
        valid = np.zeros((b, width), dtype=bool)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = p
            valid[i, width - len(p):] = True
        positions = np.clip(valid.cumsum(1) - 1, 0, None).astype(np.int64)
        empty = np.zeros((self.layers, b, self.heads, 0, self.head_dim), dtype=np.float32)
        logits, past_k, past_v = self.step(ids, positions, valid, empty, empty, memory_k, memory_v)
        pos, key_mask = positions[:, -1], valid
        out = [[] for _ in range(b)]
        done = np.zeros(b, dtype=bool)
        for t in range(max(budget)):
            last = logits[:, -1].astype(np.float32)  # [B, V]
            if on_logits is not None:
                on_logits(t, last.copy())
            last[:, banned] = -np.inf
            if t < min_new_tokens:
                last[:, self.eos] = -np.inf
            next_ids = last.argmax(-1)
            for i in range(b):
                if not done[i]:
                    if next_ids[i] == self.eos:
                        done[i] = True
                    else:
                        out[i].append(int(next_ids[i]))
                        done[i] = len(out[i]) >= budget[i]
            if done.all():
                break
            pos = np.minimum(pos + 1, self.max_len - 1)  # a finished row is still fed: keep it in the table
            key_mask = np.concatenate([key_mask, np.ones((b, 1), dtype=bool)], 1)
            logits, past_k, past_v = self.step(next_ids[:, None].astype(np.int64), pos[:, None], key_mask,
                                               past_k, past_v, memory_k, memory_v)
        return out

    # ---- the tasks ----
    def answer(self, image: Any, question: str, max_new_tokens: int = ANSWER_TOKENS) -> str:
        return self.answer_batch([image], [question], max_new_tokens)[0]

    def answer_batch(self, images: list[Any], questions: list[str], max_new_tokens: int = ANSWER_TOKENS) -> list[str]:
        if len(images) != len(questions):
            raise InputError(f"{len(images)} images for {len(questions)} questions")
        mk, mv = self.encode(images)
        prompts = [self.tokenizer.vqa_prompt(q, max_len=self.max_len) for q in questions]
        return [self.tokenizer.decode(s) for s in self.greedy(prompts, mk, mv, max_new_tokens, min_new_tokens=1)]

    def caption(self, image: Any, max_new_tokens: int | None = None) -> str:
        mk, mv = self.encode([image])
        out = self.greedy([self.tokenizer.caption_prompt()], mk, mv, max_new_tokens, min_new_tokens=1)
        return self.tokenizer.decode(out[0])


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Answer or caption with an exported (ONNX) vqa model.")
    p.add_argument("folder", help="a folder written by `vqa export --onnx`")
    p.add_argument("image")
    p.add_argument("question", nargs="?", help="a question (none: a caption)")
    args = p.parse_args(argv)
    try:
        pred = OnnxPredictor(args.folder)
        # an empty question is refused (by `vqa_prompt`), as one of only spaces is: no question is `None`
        print(pred.caption(args.image) if args.question is None else pred.answer(args.image, args.question))
    except (CheckpointError, InputError) as e:
        print(f"vqa.export.runtime: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
