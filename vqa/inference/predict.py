"""Predictor: load a checkpoint once, then answer questions, caption and rank candidate answers, and show
where the model looked (the decoder's cross-attention over the image patches).

    from vqa import Predictor
    p = Predictor.from_pretrained("runs/tiny")          # CUDA, else MPS, else CPU
    p.answer("cat.png", "what color is the cat?", top_k=3).top_k    # [("black", 0.81), ("gray", 0.07), ...]
    p.caption(img, method="beam", num_beams=3).caption
    p.rank(img, "is there a dog?", ["yes", "no"])       # [("no", 0.93), ("yes", 0.07)]

Images are anything `vqa.data.images.load_image` takes: a path, a PIL image or a uint8 array. They become the
model's input through `vqa.data.preprocess.model_input`, the function training uses, so a picture gives the
model the pixels it was trained on.

Decoding. Every method takes a `GenerationConfig` (`generation=`) and/or its fields as keywords
(`method="sample", top_p=0.9, seed=3`), validated in one place. Captions decode greedily by default. No
method ever generates a special token but <eos> (the tokenizer's `never_generated`: <bos>, <pad>, <unk>, the
task markers), and an answer or caption has at least one token (min_new_tokens is at least 1).

Tasks. A model answers (and ranks) only if trained for questions and captions only if trained for captions
(its card's `tasks`, as `vqa eval` checks): otherwise InputError.

Probabilities. `answer(top_k=k)` decodes with beam search of max(k, 3) beams and length penalty 0 unless a
config says otherwise, so hypotheses rank by total log-probability, and reports for each distinct answer
text found exp(total log-probability of its tokens and <eos>): the probability the model gives that exact
answer (summed over token sequences that spell the same text: `vqa.inference.results`). They are *not*
renormalized over the k answers (nor over the outputs allowed), so they sum to at most 1 and the gap is the
mass of the answers not returned; `answer` is the most probable one. top_k > 1 needs beam search of at least
k beams: greedy decoding and sampling give one answer, and asking them for more is an InputError. `rank()`
scores a closed list instead: a softmax over the candidates' total log-probabilities, summing to 1.

Questions. An empty question raises InputError; a question longer than the model's context is cut from the
end (`Tokenizer.max_question_tokens`) and the result's `truncated` says so. Characters outside the
tokenizer's vocabulary (emoji, scripts absent from training) are spelled in their UTF-8 bytes (byte
fallback, `vqa.tokenizer`); a tokenizer made before byte fallback gives them as <unk>: the model still answers.

Encodings. The image encoder runs once per distinct picture (by content: `vqa.inference.picture_inputs`), so a
second question about the same picture only runs the decoder.

Attention maps. With `return_attention=True` a result carries `attention` [G, L, H, grid, grid]: for each of
the G generated tokens, every decoder layer's and head's cross-attention weights over the image patches
(prefix tokens such as CLS are dropped, so a map sums to at most 1). `vqa.inference.heatmaps.attention_heatmap()` draws
one over the original image, undoing the letterbox. Batched calls compute the maps of all rows in one
teacher-forced pass.

Explaining. `explain(image, question)` returns every attention weight behind the answer (`explain(image)`: the
caption), read on a separate unfused pass. `image_features` gives each picture's pooled encoding.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..config import DECODING_METHODS, GenerationConfig, ranking_methods
from ..data.images import load_image
from ..data.transforms import build_transform
from ..decoding.compiled import encode as encode_images
from ..decoding.generate import generate, generation_config, patch_maps, score_candidates
from ..decoding.precision import apply_run_policy
from ..device import pick_device
from ..errors import InputError
from ..identity import checkpoint_identity
from ..weights.checkpoint import load as load_checkpoint
from ..weights.checkpoint import resolve as resolve_checkpoint
from .picture_inputs import EncodingCache, PictureInputs
from .pointing import Point, locate
from .results import Answer, Caption, answers_from_beams, ranked_candidates

# ----------------------------------------------------------------------------------------------- predictor


class Predictor(PictureInputs):
    """A loaded model with its tokenizer, card and image transform; thread-safe (calls are serialized)."""

    def __init__(self, model, tokenizer, card: dict | None = None, device=None, cache_size: int = 8,
                 max_pixels: int | None = None, quantize: str | None = None, dtype: torch.dtype | str | None = None,
                 compile: bool | None = None, answer_vocab: Sequence[str] | None = None):
        """`quantize="int8"`: dynamic int8 linear layers on a CPU (`vqa.decoding.precision`; where int8 cannot run, a
        warning and float32 -- `notice` keeps the message). `dtype`: the weights' dtype (torch.float32,
        torch.bfloat16, "fp32", "bf16", ...). `compile`: decode through the torch.compile'd step
        (`vqa.decoding.compiled`; on a CPU in float32 it pays for long-running use, after seconds of compiling
        per batch shape). Their defaults: `vqa.decoding.precision`. `cache_size`: pictures whose encodings
        are kept (`vqa.inference.picture_inputs.EncodingCache`). `answer_vocab`: texts whose tokens are the only ones an
        answer may use (see `set_answer_vocab`)."""
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device).eval()
        policy = apply_run_policy(self.model, self.device, quantize, dtype, compile)
        self.precision, self.notice, self.compile = policy.precision, policy.notice, policy.compile
        self.dtype = policy.dtype  # what the images go in as
        self.tokenizer = tokenizer
        self.card = dict(card or {})
        self.tasks = tuple(self.card.get("tasks") or ("vqa", "caption"))  # what the model was trained for
        self.cfg = model.cfg
        self.transform = build_transform(self.cfg, train=False, max_pixels=max_pixels)
        self.grid = self.cfg.grid
        self.encodings = EncodingCache(cache_size)
        self._lock = threading.RLock()
        self.path: Path | None = None
        self.answer_vocab: list[int] | None = None
        if answer_vocab is not None:
            self.set_answer_vocab(answer_vocab)

    def set_answer_vocab(self, answers: Sequence[str] | None) -> None:
        """Decode answers over the tokens of `answers` (texts) only, or over the whole vocabulary (None).

        This limits the *tokens*, not the answers: an answer is any sequence of those tokens (["yes", "no"]
        allows "yes", "no", but also "yes no" or "no no no"), with at least one token; probabilities are
        renormalized over them (`generate(vocab=...)`). To choose among whole answers, use `rank()`."""
        if answers is None:
            self.answer_vocab = None
            return
        answers = [a for a in answers if isinstance(a, str) and a.strip()]
        if not answers:
            raise InputError("answer_vocab needs at least one non-empty answer")
        tokens = {t for a in answers for t in self.tokenizer.encode(a)} - self.tokenizer.never_generated
        if not tokens:
            raise InputError("answer_vocab: none of its answers has a token the model can generate (characters "
                             "it does not know are <unk>, which it never generates)")
        self.answer_vocab = sorted(tokens | {self.tokenizer.eos_id})

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device | None = None,
                        revision: str | None = None, **kwargs) -> Predictor:
        """Load a checkpoint folder or a run folder (its best/, else last/), or a Hugging Face Hub name
        ("user/name", "user/name@rev" or `revision=`: `vqa.weights.hub`), onto `device` (default: CUDA, else
        MPS, else CPU). `kwargs`: the constructor's (quantize="int8", dtype=..., compile=..., ...)."""
        dev = pick_device(device)
        folder = resolve_checkpoint(path, revision)  # a Hub name: its snapshot folder in the cache
        model, tokenizer, card = load_checkpoint(folder, device=dev)
        p = cls(model, tokenizer, card, device=dev, **kwargs)
        p.path = Path(path) if Path(path).exists() else folder
        return p

    @functools.cached_property
    def identity(self) -> str | None:
        """The checkpoint's identity (`vqa.identity`: all of its weights, adapters, config and tokenizer), read
        on first use; None for a model given in memory."""
        return checkpoint_identity(resolve_checkpoint(self.path)) if self.path is not None else None

    def __repr__(self) -> str:
        return (f"Predictor({self.path or 'in-memory model'}, device={self.device}, {self.precision}, "
                f"{self.model.num_parameters():,} parameters)")

    # ---- images and their encodings (the pictures themselves: `PictureInputs`) ----
    @property
    def cache_size(self) -> int:
        """How many pictures' encodings are kept."""
        return self.encodings.size

    def _encode(self, images: Sequence[Any]) -> tuple[torch.Tensor, list[int]]:
        """Memory [M, N, D] of the distinct images among `images`, and each image's row in it."""
        return self.encodings.memory([self._prepare(img) for img in images], self._encode_inputs)

    def _encode_inputs(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The image encoder's output [B, N, D] for model inputs [3, S, S] (uint8)."""
        batch = torch.stack([self.transform.finish(x) for x in inputs]).to(self.device, self.dtype)
        with torch.no_grad():
            return encode_images(self.model, batch, self.compile)

    # ---- text helpers ----
    def _question_prompt(self, question: Any) -> tuple[list[int], bool]:
        if question is None or not isinstance(question, str):
            raise InputError(f"the question must be text, not {type(question).__name__}")
        if not question.strip():
            raise InputError("the question is empty")
        full = len(self.tokenizer.encode(question))
        prompt = self.tokenizer.vqa_prompt(question, max_len=self.cfg.dec_max_len)
        return prompt, len(prompt) - 3 < full

    def _reached_budget(self, prompt, ids, settings: GenerationConfig) -> bool:
        return len(ids) >= settings.budget(self.cfg.dec_max_len - len(prompt))

    def _attach_maps(self, results: list, memory, index: list[int], prompts) -> None:
        """Each result's attention maps, all rows in one teacher-forced pass."""
        for res, m in zip(results, patch_maps(self.model, memory, index, prompts, [r.ids for r in results]),
                          strict=True):
            res.attention = m

    def _pieces(self, ids: list[int]) -> list[str]:
        return self.tokenizer.pieces(ids)  # word starts keep their space, whatever the tokenizer's marker

    def image_features(self, images: Any, cache: bool = True) -> np.ndarray:
        """[B, D]: each image's encoded tokens averaged, L2-normalised (`vqa.demo.familiarity`). With `cache`, the
        encodings come from (and go to) the answer cache; without, they are computed and forgotten."""
        images = _as_list(images)
        if cache:
            with self._lock:
                memory, index = self._encode(images)
            tokens = memory[torch.as_tensor(index, device=memory.device)]
        else:
            x = torch.stack([self.transform.finish(self.model_input(i)) for i in images]).to(self.device, self.dtype)
            with self._lock, torch.inference_mode():
                tokens = self.model.encode(x)
        return torch.nn.functional.normalize(tokens.float().mean(1), dim=-1).cpu().numpy()

    # ---- VQA ----
    def answer(self, image: Any, question: str, top_k: int = 1, generation: GenerationConfig | None = None,
               return_attention: bool = False, **changes) -> Answer:
        """The answer to `question` about `image`, with the `top_k` most likely answers and their
        probabilities (see the module docstring). `changes`: GenerationConfig fields."""
        return self.answer_batch([image], [question], top_k, generation, return_attention, **changes)[0]

    def check_task(self, task: str) -> None:
        """InputError unless the model was trained for `task` ("vqa" or "caption"; its card's `tasks`)."""
        trained = ", ".join(self.tasks)
        if task == "vqa" and task not in self.tasks:
            raise InputError(f"this model is a captioner, trained to caption only (its card's tasks: {trained}): "
                             "it does not answer questions; caption with it, or fine-tune it for questions with "
                             "`vqa train --init-from RUN --data DIR`")
        if task not in self.tasks:
            raise InputError(f"this model was trained to answer questions only (its card's tasks: {trained}): it "
                             "does not caption; ask it questions, or fine-tune it for captions with `vqa train "
                             "--init-from RUN --data DIR --tasks vqa,caption`")

    def answer_settings(self, top_k: int = 1, generation: GenerationConfig | None = None,
                        changes: dict | None = None) -> GenerationConfig:
        """The decoding `answer` uses: `generation` (default: beam search over max(top_k, 3) beams at
        length penalty 0, answers of at most 10 tokens) with the GenerationConfig fields in `changes`, and
        min_new_tokens at least 1. InputError for a model not trained for questions, and for top_k > 1
        without beam search of at least top_k beams (greedy decoding and sampling give one answer)."""
        self.check_task("vqa")
        default = GenerationConfig.served("vqa", top_k)
        settings = _at_least_one_token(generation_config(generation, changes or {}, default))
        ranked = DECODING_METHODS[settings.method].ranked
        if top_k > 1 and not ranked:
            ranking = ranking_methods()
            raise InputError(f"top_k={top_k} lists the {top_k} likeliest answers, which only "
                             f"{' or '.join(ranking)} search finds: {settings.method} decoding gives one answer "
                             f"(use method='{ranking[0]}', or top_k=1; `rank` scores a list of answers you give)")
        if ranked and settings.num_beams < top_k:
            raise InputError(f"num_beams={settings.num_beams} cannot return top_k={top_k} answers")
        return settings

    def caption_settings(self, generation: GenerationConfig | None = None,
                         changes: dict | None = None) -> GenerationConfig:
        """The decoding `caption` uses: `generation` (default: greedy) with the GenerationConfig fields in
        `changes`, and min_new_tokens at least 1. InputError for a model not trained to caption."""
        self.check_task("caption")
        return _at_least_one_token(generation_config(generation, changes or {}, GenerationConfig.served("caption")))

    def answer_batch(self, images: Sequence[Any], questions: Sequence[str], top_k: int = 1,
                     generation: GenerationConfig | None = None, return_attention: bool = False,
                     watch=None, **changes) -> list[Answer]:
        """`answer` for each (image, question) pair in one batched decoding; a single image (not in a list)
        is asked every question. Each distinct image is encoded once. `watch`: `generate`'s (streaming)."""
        images, questions = _as_list(images, len(questions)), list(questions)
        if len(images) != len(questions):
            raise InputError(f"{len(images)} images for {len(questions)} questions")
        if not questions:
            return []
        top_k = int(top_k)
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}")
        settings = self.answer_settings(top_k, generation, changes)
        prompts, truncated = zip(*(self._question_prompt(q) for q in questions), strict=True)
        with self._lock:
            memory, index = self._encode(images)
            gen = generate(self.model, list(prompts), memory=memory, image_index=index, config=settings,
                           vocab=self.answer_vocab, banned=self.tokenizer.never_generated, compile=self.compile,
                           watch=watch)
            results = []
            for b, question in enumerate(questions):
                hyps = gen.beams[b] if gen.beams else [(gen.sequences[b], gen.scores[b])]
                ranked, best = answers_from_beams(hyps, self.tokenizer.decode, top_k)
                results.append(Answer(question=question, answer=self.tokenizer.decode(best), top_k=ranked,
                                      truncated=truncated[b], tokens=self._pieces(best),
                                      prompt_ids=list(prompts[b]), ids=list(best),
                                      cut=self._reached_budget(prompts[b], best, settings)))
            if return_attention:
                self._attach_maps(results, memory, index, prompts)
        return results

    def point(self, image: Any, phrase: str, **changes) -> Point:
        """Where the object `phrase` names ("the red star") is in `image`: a point and a box in the picture's
        pixels, or found=False when the model says there is none (`vqa.inference.pointing`)."""
        return self.point_batch([image], [phrase], **changes)[0]

    def point_batch(self, images: Sequence[Any], phrases: Sequence[str], **changes) -> list[Point]:
        """`point` for each (image, phrase) pair in one batched decoding."""
        pictures = [load_image(img) for img in _as_list(images, len(phrases))]
        return locate(self, pictures, [p.size for p in pictures], list(phrases), **changes)

    def rank(self, image: Any, question: str, candidates: Sequence[str]) -> list[tuple[str, float]]:
        """The candidate answers sorted by likelihood, with probabilities softmaxed over the candidates."""
        candidates = list(candidates)
        if not candidates:
            raise InputError("no candidate answers to rank")
        bad = [c for c in candidates if not isinstance(c, str) or not c.strip()]
        if bad:
            raise InputError(f"candidate answers must be non-empty text, got {bad[0]!r}")
        self.check_task("vqa")
        prompt, _ = self._question_prompt(question)
        cand_ids = [self.tokenizer.encode(c) for c in candidates]
        with self._lock:
            memory, _ = self._encode([image])
            logp = score_candidates(self.model, prompt, cand_ids, memory=memory)
        return ranked_candidates(candidates, logp)

    # ---- captions ----
    def caption(self, image: Any, generation: GenerationConfig | None = None, return_attention: bool = False,
                **changes) -> Caption:
        """A caption of `image`: greedy by default; `method="beam"` / `"sample"` and their settings as keywords
        or in `generation`."""
        return self.caption_batch([image], generation, return_attention, **changes)[0]

    def caption_batch(self, images: Sequence[Any], generation: GenerationConfig | None = None,
                      return_attention: bool = False, watch=None, **changes) -> list[Caption]:
        """`caption` for each image in one batched decoding. `watch`: `generate`'s (streaming)."""
        images = _as_list(images)
        if not images:
            return []
        settings = self.caption_settings(generation, changes)
        prompt = self.tokenizer.caption_prompt()
        with self._lock:
            memory, index = self._encode(images)
            gen = generate(self.model, [prompt] * len(images), memory=memory, image_index=index, config=settings,
                           banned=self.tokenizer.never_generated, compile=self.compile, watch=watch)
            results = []
            for b in range(len(images)):
                seq = gen.sequences[b]
                beams = [(self.tokenizer.decode(s), float(score)) for s, score in gen.beams[b]] if gen.beams else []
                results.append(Caption(caption=self.tokenizer.decode(seq), log_prob=float(gen.scores[b]),
                                       beams=beams, tokens=self._pieces(seq), prompt_ids=list(prompt), ids=list(seq),
                                       cut=self._reached_budget(prompt, seq, settings)))
            if return_attention:
                self._attach_maps(results, memory, index, [prompt] * len(results))
        return results

    def stream(self, image: Any, question: str | None = None, top_k: int = 1,
               generation: GenerationConfig | None = None, **changes):
        """The answer to `question` (without one: the caption) as it is decoded: yields the text so far each
        time it changes, the last one equal to `answer` / `caption`'s, and returns that Answer / Caption
        (`vqa.inference.streaming`: beam search yields its best hypothesis so far, which may be revised)."""
        from .streaming import stream

        return stream(self, image, question, top_k, generation, **changes)

    # ---- the attention explorer ----
    def explain(self, image: Any, question: str | None = None, result: Answer | Caption | None = None,
                top_k: int = 1, generation: GenerationConfig | None = None, **changes):
        """Every attention weight behind an answer (with `question`) or a caption (without): a
        `vqa.inference.explain.Explanation` holding the decoder's masked self-attention [L, H, T, T], its
        cross-attention [L, H, T, N] with the raw scores q.k / sqrt(d) before the softmax, and the ViT's
        self-attention over the patches. `result` explains an answer or caption already computed (for the
        same image) instead of decoding again; otherwise decoding is `answer` / `caption`'s with `top_k`,
        `generation` and `changes`. The weights are read on a separate, unfused pass (`vqa.inference.explain`)."""
        from .explain import Explanation, explain_tokens

        if result is None:
            result = (self.answer(image, question, top_k, generation, **changes) if question is not None
                      else self.caption(image, generation, **changes))
        if not result.prompt_ids:
            raise InputError("this result does not say which prompt it was generated after")
        pil = self.load(image)
        x = self.transform.finish(self.model_input(image))[None].to(self.device, self.dtype)  # [1, 3, S, S]
        with self._lock:
            arrays = explain_tokens(self.model, x, result.prompt_ids, result.ids)
        n = arrays["cross_weights"].shape[-1]
        prompt = [(self.tokenizer.id_to_token(i) or "").replace("▁", " ").strip() or "·" for i in result.prompt_ids]
        tokens = prompt + [t.strip() or "·" for t in self._pieces(result.ids)]
        text = result.answer if isinstance(result, Answer) else result.caption
        return Explanation(tokens=tokens, prompt_len=len(prompt), grid=self.grid, memory_prefix=n - self.grid**2,
                           vit_prefix=self.model.vision.num_prefix, image_size=self.cfg.vit_image_size, text=text,
                           question=getattr(result, "question", None), image=pil, resize=self.cfg.vit_resize,
                           cross_layer_ids=self.cfg.cross_layer_ids, **arrays)


def _at_least_one_token(settings: GenerationConfig) -> GenerationConfig:
    return settings if settings.min_new_tokens >= 1 else settings.replace(min_new_tokens=1)


def _as_list(images: Any, n: int = 1) -> list:
    """`images` as a list: a single image (not in a list) `n` times."""
    single = isinstance(images, (str, Path, Image.Image, np.ndarray)) or torch.is_tensor(images)
    return [images] * n if single else list(images)


__all__ = ["Predictor", "Answer", "Caption"]
