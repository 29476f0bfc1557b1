"""Predictor: load a checkpoint once, then answer questions, caption and rank candidate answers, and show
where the model looked (the decoder's cross-attention over the image patches).

    from vqa import Predictor
    p = Predictor.from_pretrained("runs/tiny")          # CUDA, else MPS, else CPU
    p.answer("cat.png", "what color is the cat?", top_k=3).top_k    # [("black", 0.81), ("gray", 0.07), ...]
    p.caption(img, num_beams=3).caption
    p.rank(img, "is there a dog?", ["yes", "no"])       # [("no", 0.93), ("yes", 0.07)]

Images are anything `vqa.data.images.load_image` takes: a path, a PIL image or a uint8 array.

Probabilities. `answer(top_k=k)` decodes greedily and with beam search of max(k, 3) beams (length
penalty 0, so hypotheses rank by total log-probability) and reports for each distinct answer text found
exp(total log-probability of its tokens and <eos>): the probability the model gives that exact answer (summed
over token sequences that spell the same text). They are *not* renormalized over the k answers, so they sum to
at most 1 and the gap is the mass of the answers not returned; `answer` is the most probable one.
`rank()` scores a closed list instead: a softmax over the candidates' total log-probabilities, summing to 1.

Questions. An empty question raises InputError; a question longer than the model's context is cut from the
end (`tokenizer.vqa_prompt(max_len=cfg.dec_max_len)`) and the result's `truncated` says so. Characters the
tokenizer does not know (emoji, scripts absent from training) become <unk>: the model still answers.

Encodings. The image encoder runs once per distinct image: encodings are kept in a small LRU cache keyed by
the SHA-1 of the letterboxed uint8 model input, so a second question about the same picture (from a path, a
PIL image or an array alike) only runs the decoder. Batched calls encode each distinct image once.

Attention maps. With `return_attention=True` a result carries `attention` [G, L, H, grid, grid]: for each of
the G generated tokens, every decoder layer's and head's cross-attention weights over the image patches
(prefix tokens such as CLS are dropped, so a map sums to at most 1). `attention_heatmap()` draws one over
the original image, undoing the letterbox.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from .checkpoint import load as load_checkpoint
from .data.images import load_image
from .data.transforms import build_transform
from .errors import InputError
from .generate import cross_attention_maps, generate, score_candidates

MAX_ANSWER_TOKENS = 10  # VQA answers are a few words


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """`device` if given, else CUDA, else Apple's MPS, else the CPU."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# ----------------------------------------------------------------------------------------------- results


@dataclass
class _Generated:
    tokens: list[str] = field(default_factory=list)  # the generated pieces, as text (word starts keep a space)
    attention: torch.Tensor | None = None  # [G, L, H, grid, grid] on the CPU, when asked for

    def words(self) -> list[tuple[str, torch.Tensor | None]]:
        """The generated words with their attention maps [L, H, grid, grid]: word pieces are joined and
        their maps averaged. A piece that starts with a space (the tokenizer's word marker) starts a word."""
        groups: list[tuple[str, list[int]]] = []
        for i, tok in enumerate(self.tokens):
            if not groups or tok.startswith(" ") or not tok.strip():
                groups.append((tok.strip(), [i]))
            else:
                text, idx = groups[-1]
                groups[-1] = (text + tok, idx + [i])
        out = []
        for text, idx in groups:
            maps = None if self.attention is None else self.attention[idx].mean(0)
            out.append((text or "·", maps))
        return out


@dataclass
class Answer(_Generated):
    question: str = ""
    answer: str = ""
    top_k: list[tuple[str, float]] = field(default_factory=list)  # (answer, probability), most likely first
    truncated: bool = False  # the question was cut to fit the model's context

    def to_dict(self) -> dict:
        return dict(
            question=self.question, answer=self.answer, truncated=self.truncated,
            top_k=[dict(answer=a, probability=round(p, 6)) for a, p in self.top_k],
        )


@dataclass
class Caption(_Generated):
    caption: str = ""
    log_prob: float = 0.0  # total log-probability of the caption (incl. <eos>)
    beams: list[tuple[str, float]] = field(default_factory=list)  # beam search: (caption, log-prob), best first

    def to_dict(self) -> dict:
        return dict(
            caption=self.caption, log_prob=round(self.log_prob, 6),
            beams=[dict(caption=c, log_prob=round(s, 6)) for c, s in self.beams],
        )


# ----------------------------------------------------------------------------------------------- predictor


class Predictor:
    """A loaded model with its tokenizer, card and image transform; thread-safe (calls are serialized)."""

    def __init__(self, model, tokenizer, card: dict | None = None, device=None, cache_size: int = 8,
                 max_pixels: int | None = None):
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.card = dict(card or {})
        self.cfg = model.cfg
        self.transform = build_transform(self.cfg, train=False)
        self.grid = self.cfg.vit_image_size // self.cfg.vit_patch_size
        self.cache_size = int(cache_size)
        self.max_pixels = max_pixels  # None: load_image's own limit
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.RLock()
        self.path: Path | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device | None = None, **kwargs) -> Predictor:
        """Load a checkpoint folder or a run folder (its best/, else last/) onto `device` (default: CUDA,
        else MPS, else CPU)."""
        dev = pick_device(device)
        model, tokenizer, card = load_checkpoint(path, device=dev)
        p = cls(model, tokenizer, card, device=dev, **kwargs)
        p.path = Path(path)
        return p

    def __repr__(self) -> str:
        return f"Predictor({self.path or 'in-memory model'}, device={self.device}, {self.model.num_parameters():,} parameters)"

    # ---- images and their encodings ----
    def load(self, image: Any) -> Image.Image:
        """The RGB PIL image of any accepted input (raises InputError for bad or over-large images)."""
        if image is None:
            raise InputError("no image given")
        return load_image(image, max_pixels=self.max_pixels)

    def _prepare(self, image: Any) -> tuple[str, torch.Tensor]:
        x = self.transform.prepare(self.load(image))  # uint8 [3, S, S]
        return hashlib.sha1(x.numpy().tobytes()).hexdigest(), x

    def _encode(self, images: Sequence[Any]) -> tuple[torch.Tensor, list[int]]:
        """Memory [M, N, D] of the distinct images among `images`, and each image's row in it."""
        keys, index, prepared = [], [], {}
        for img in images:
            key, x = self._prepare(img)
            if key not in prepared:
                prepared[key] = x
                keys.append(key)
            index.append(keys.index(key))
        missing = [k for k in keys if k not in self._cache]
        if missing:
            batch = torch.stack([self.transform.finish(prepared[k]) for k in missing]).to(self.device)
            with torch.no_grad():
                memory = self.model.encode(batch)
            for k, m in zip(missing, memory, strict=True):
                self._cache[k] = m
        rows = []
        for k in keys:
            self._cache.move_to_end(k)
            rows.append(self._cache[k])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return torch.stack(rows), index

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    # ---- text helpers ----
    def _question_prompt(self, question: Any) -> tuple[list[int], bool]:
        if question is None or not isinstance(question, str):
            raise InputError(f"the question must be text, not {type(question).__name__}")
        if not question.strip():
            raise InputError("the question is empty")
        full = len(self.tokenizer.encode(question))
        prompt = self.tokenizer.vqa_prompt(question, max_len=self.cfg.dec_max_len)
        return prompt, len(prompt) - 3 < full

    def _pieces(self, ids: list[int]) -> list[str]:
        out = []
        for i in ids:
            tok = self.tokenizer.id_to_token(i) or ""
            out.append(tok.replace("▁", " "))
        return out

    def _maps(self, memory: torch.Tensor, prompt: list[int], generated: list[int]) -> torch.Tensor:
        """[G, L, H, grid, grid] patch attention (prefix tokens dropped) on the CPU."""
        g = self.grid
        if not generated:
            return torch.zeros(0, self.cfg.dec_depth, self.cfg.dec_heads, g, g)
        maps = cross_attention_maps(self.model, memory[None], prompt, generated)  # [G, L, H, N]
        maps = maps[..., maps.shape[-1] - g * g :]
        return maps.reshape(*maps.shape[:3], g, g).float().cpu()

    # ---- VQA ----
    def answer(self, image: Any, question: str, top_k: int = 1, num_beams: int | None = None,
               max_new_tokens: int = MAX_ANSWER_TOKENS, return_attention: bool = False) -> Answer:
        """The answer to `question` about `image`, with the `top_k` most likely answers and their
        probabilities (see the module docstring)."""
        return self.answer_batch([image], [question], top_k, num_beams, max_new_tokens, return_attention)[0]

    def answer_batch(self, images: Sequence[Any], questions: Sequence[str], top_k: int = 1,
                     num_beams: int | None = None, max_new_tokens: int = MAX_ANSWER_TOKENS,
                     return_attention: bool = False) -> list[Answer]:
        """`answer` for each (image, question) pair in one batched decoding; a single image (not in a list)
        is asked every question. Each distinct image is encoded once."""
        if _is_single_image(images):
            images = [images] * len(questions)
        images, questions = list(images), list(questions)
        if len(images) != len(questions):
            raise InputError(f"{len(images)} images for {len(questions)} questions")
        if not questions:
            return []
        top_k = int(top_k)
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        beams = int(num_beams) if num_beams else max(top_k, 3)
        if beams < top_k:
            raise InputError(f"num_beams={beams} cannot return top_k={top_k} answers")
        prompts, truncated = zip(*(self._question_prompt(q) for q in questions), strict=True)
        with self._lock:
            memory, index = self._encode(images)
            kw = dict(memory=memory, image_index=index, max_new_tokens=max_new_tokens)
            greedy = generate(self.model, list(prompts), **kw)
            gen = generate(self.model, list(prompts), num_beams=beams, length_penalty=0.0, **kw) if beams > 1 else greedy
            results = []
            for b, question in enumerate(questions):
                # the greedy answer joins the beams: beam search that stops early can miss it
                hyps = [(greedy.sequences[b], greedy.scores[b])]
                hyps += gen.beams[b] if gen.beams else []
                seen, merged, best_seq = set(), {}, {}
                for seq, logp in hyps:
                    if tuple(seq) in seen:
                        continue
                    seen.add(tuple(seq))
                    text = self.tokenizer.decode(seq)  # distinct token sequences may spell the same text
                    merged[text] = merged.get(text, 0.0) + float(np.exp(logp))
                    if text not in best_seq or logp > best_seq[text][1]:
                        best_seq[text] = (seq, logp)
                ranked = sorted(merged.items(), key=lambda kv: -kv[1])[:top_k]
                best = best_seq[ranked[0][0]][0]
                res = Answer(question=question, answer=self.tokenizer.decode(best), top_k=ranked,
                             truncated=truncated[b], tokens=self._pieces(best))
                if return_attention:
                    res.attention = self._maps(memory[index[b]], prompts[b], best)
                results.append(res)
        return results

    def rank(self, image: Any, question: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        """The candidate answers sorted by likelihood, with probabilities softmaxed over the candidates."""
        candidates = list(candidates)
        if not candidates:
            raise InputError("no candidate answers to rank")
        bad = [c for c in candidates if not isinstance(c, str) or not c.strip()]
        if bad:
            raise InputError(f"candidate answers must be non-empty text, got {bad[0]!r}")
        prompt, _ = self._question_prompt(question)
        cand_ids = [self.tokenizer.encode(c) for c in candidates]
        with self._lock:
            memory, _ = self._encode([image])
            logp = score_candidates(self.model, prompt, cand_ids, memory=memory)
        probs = torch.softmax(logp.float(), 0).tolist()
        return sorted(zip(candidates, probs, strict=True), key=lambda cp: -cp[1])

    # ---- captions ----
    def caption(self, image: Any, num_beams: int = 1, do_sample: bool = False, top_p: float = 1.0,
                top_k: int = 0, temperature: float = 1.0, max_new_tokens: int | None = None,
                length_penalty: float = 1.0, seed: int | None = None, return_attention: bool = False) -> Caption:
        """A caption of `image`: greedy by default, beam search with `num_beams` > 1, or top-k / top-p
        sampling with `do_sample` (reproducible with `seed`)."""
        return self.caption_batch([image], num_beams, do_sample, top_p, top_k, temperature, max_new_tokens,
                                  length_penalty, seed, return_attention)[0]

    def caption_batch(self, images: Sequence[Any], num_beams: int = 1, do_sample: bool = False,
                      top_p: float = 1.0, top_k: int = 0, temperature: float = 1.0,
                      max_new_tokens: int | None = None, length_penalty: float = 1.0, seed: int | None = None,
                      return_attention: bool = False) -> list[Caption]:
        """`caption` for each image in one batched decoding."""
        if _is_single_image(images):
            images = [images]
        images = list(images)
        if not images:
            return []
        num_beams = int(num_beams)
        if num_beams < 1:
            raise InputError(f"num_beams must be at least 1, got {num_beams}")
        if do_sample and num_beams > 1:
            raise InputError("choose beam search or sampling, not both")
        if not 0.0 < float(top_p) <= 1.0:
            raise InputError(f"top_p must be in (0, 1], got {top_p}")
        if int(top_k) < 0:
            raise InputError(f"top_k must be >= 0 (0: no limit), got {top_k}")
        if float(temperature) <= 0:
            raise InputError(f"temperature must be > 0, got {temperature}")
        prompt = self.tokenizer.caption_prompt()
        limit = self.cfg.dec_max_len - len(prompt)
        max_new = limit if max_new_tokens is None else max(1, min(int(max_new_tokens), limit))
        with self._lock:
            memory, index = self._encode(images)
            g = None
            if do_sample and seed is not None:
                g = torch.Generator(device=self.device).manual_seed(int(seed))
            gen = generate(self.model, [prompt] * len(images), memory=memory, image_index=index,
                           max_new_tokens=max_new, num_beams=num_beams, length_penalty=length_penalty,
                           do_sample=do_sample, temperature=float(temperature), top_k=int(top_k),
                           top_p=float(top_p), generator=g)
            results = []
            for b in range(len(images)):
                seq = gen.sequences[b]
                beams = [(self.tokenizer.decode(s), float(lp)) for s, lp in gen.beams[b]] if gen.beams else []
                res = Caption(caption=self.tokenizer.decode(seq), log_prob=float(gen.scores[b]), beams=beams,
                              tokens=self._pieces(seq))
                if return_attention:
                    res.attention = self._maps(memory[index[b]], prompt, seq)
                results.append(res)
        return results


def _is_single_image(x: Any) -> bool:
    return isinstance(x, (str, Path, Image.Image, np.ndarray)) or torch.is_tensor(x)


# ----------------------------------------------------------------------------------------------- heatmaps


def letterbox_box(width: int, height: int, size: int) -> tuple[float, float, float, float]:
    """Where a width x height image lies inside the size x size letterboxed model input
    (left, top, right, bottom in model-input pixels), as `ImageTransform.prepare` places it."""
    scale = size / max(width, height)
    nw, nh = max(1, round(width * scale)), max(1, round(height * scale))
    left, top = (size - nw) // 2, (size - nh) // 2
    return float(left), float(top), float(left + nw), float(top + nh)


def select_map(maps: torch.Tensor | np.ndarray, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """One [grid, grid] map from [L, H, grid, grid] (or [grid, grid]): the given layer / head (0-based),
    averaged over the others."""
    m = torch.as_tensor(np.asarray(maps) if not torch.is_tensor(maps) else maps).float()
    if m.ndim == 2:
        return m.numpy()
    if m.ndim != 4:
        raise InputError(f"attention maps must be [layers, heads, grid, grid] or [grid, grid], got {tuple(m.shape)}")
    for name, i, n in (("layer", layer, m.shape[0]), ("head", head, m.shape[1])):
        if i is not None and not 0 <= int(i) < n:
            raise InputError(f"{name} {i} does not exist: the model has {n} (0-based)")
    m = m[int(layer)][None] if layer is not None else m
    m = m[:, int(head)][:, None] if head is not None else m
    return m.mean((0, 1)).numpy()


def upsample_map(m: np.ndarray, width: int, height: int, image_size: int) -> np.ndarray:
    """A [grid, grid] map over the letterboxed `image_size` square, cropped to the picture's region and
    stretched (bilinear) onto a width x height picture: float32 [height, width]."""
    m = np.asarray(m, dtype=np.float32)
    cell = image_size / m.shape[-1]
    left, top, right, bottom = letterbox_box(width, height, image_size)
    box = (left / cell, top / cell, right / cell, bottom / cell)  # the picture's region in grid units
    up = Image.fromarray(m, mode="F").resize((width, height), Image.Resampling.BILINEAR, box=box)
    return np.asarray(up, dtype=np.float32)


def attention_heatmap(image: Any, maps, layer: int | None = None, head: int | None = None,
                      image_size: int | None = None, alpha: float = 0.6, colormap: str = "turbo") -> Image.Image:
    """`image` (as the user gave it) with an attention map laid over it, same size as the image.

    `maps` is [L, H, grid, grid] (averaged over layers and heads unless `layer` / `head` picks one, 0-based)
    or a single [grid, grid] map. The map covers the letterboxed square the model saw (`image_size` px, by
    default grid * 8 — pass the model's `vit_image_size` for exact placement); only the part over the picture
    is kept, stretched back onto it with bilinear interpolation. Values are scaled to 0..1 (min to max over
    the picture) before the colormap (turbo: dark red = most), so the picture shows where attention is
    relatively high; the overlay's opacity is `alpha` there and fades to a quarter of it where attention is
    lowest, so the picture stays visible."""
    import matplotlib

    img = image if isinstance(image, Image.Image) and image.mode == "RGB" else load_image(image)
    m = select_map(maps, layer, head)
    up = upsample_map(m, img.width, img.height, image_size or m.shape[-1] * 8)
    lo, hi = float(up.min()), float(up.max())
    up = (up - lo) / (hi - lo) if hi > lo else np.zeros_like(up)
    levels = np.clip(up * 255 + 0.5, 0, 255).astype(np.uint8)
    lut = (matplotlib.colormaps[colormap](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.float32)
    opacity = float(alpha) * (0.25 + 0.75 * up)[..., None]  # low attention lets the picture show through
    mixed = np.asarray(img, dtype=np.float32) * (1 - opacity) + lut[levels] * opacity
    return Image.fromarray(np.clip(mixed + 0.5, 0, 255).astype(np.uint8), "RGB")


__all__ = ["Predictor", "Answer", "Caption", "pick_device", "attention_heatmap", "select_map", "letterbox_box",
           "upsample_map"]
