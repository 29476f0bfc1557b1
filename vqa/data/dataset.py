"""The torch dataset for VQA and captioning together, indexed by image (batches: `vqa.data.collate`).

Why by image: the encoder is the costly part, so one item is one image plus several text rows about it (up to
`questions_per_image` questions and `captions_per_image` captions); the model encodes each image once and the
decoder reads it for every row (`image_index` maps rows to images). The task mix per image is therefore
questions_per_image : captions_per_image (e.g. 4:1); images with only one kind of record give only that kind.

Determinism: every random choice in `__getitem__` (which questions, which of the 10 answers, which caption,
the augmentation) comes from generators seeded by (seed, epoch, index), so a resumed run draws the same data
whatever the worker layout. Call `set_epoch(e)` at the start of each epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import TrainConfig
from ..errors import ConfigError
from ..tokenizer import Tokenizer
from .formats import CaptionRecord, SplitData, VQARecord
from .images import load_image
from .transforms import ImageTransform

TASKS = ("vqa", "caption")


class ImageTextDataset(Dataset):
    """Items: dict(image=FloatTensor[3,S,S], rows=[dict(input_ids, loss_mask, task, meta, prompt_len)])."""

    def __init__(
        self,
        split_data: SplitData,
        tokenizer: Tokenizer,
        transform: ImageTransform,
        max_len: int,
        tasks: Sequence[str] = TASKS,
        questions_per_image: int = TrainConfig.questions_per_image,
        captions_per_image: int = TrainConfig.captions_per_image,
        train: bool = True,
        seed: int = 0,
        cache_images: bool = False,
    ):
        unknown = set(tasks) - set(TASKS)
        if unknown:
            raise ConfigError(f"unknown task(s) {sorted(unknown)}; choose from {TASKS}")
        self.tok, self.transform, self.max_len = tokenizer, transform, int(max_len)
        self.qpi, self.cpi = int(questions_per_image), int(captions_per_image)
        self.train, self.seed, self.epoch = bool(train), int(seed), 0
        use_vqa = "vqa" in tasks and (self.qpi > 0 or not train)
        use_cap = "caption" in tasks and (self.cpi > 0 or not train)
        groups: dict[Path, tuple[list[VQARecord], list[CaptionRecord]]] = {}
        for r in split_data.vqa if use_vqa else []:
            groups.setdefault(r.image, ([], []))[0].append(r)
        for c in split_data.captions if use_cap else []:
            groups.setdefault(c.image, ([], []))[1].append(c)
        self.images = list(groups)
        self.groups = [groups[p] for p in self.images]
        self.n_questions = sum(len(g[0]) for g in self.groups)
        self.n_captions = sum(len(g[1]) for g in self.groups)
        self.cache_images = bool(cache_images)
        self._cache: dict[int, Any] = {}
        self._ids: dict[tuple[str, str], list[int]] = {}  # (kind, text) -> token ids: every epoch repeats them

    def __len__(self) -> int:
        return len(self.images)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    # ---- images ----
    def _prepared(self, i: int) -> torch.Tensor:
        """The decoded, letterboxed uint8 image [3, S, S], from the cache if kept."""
        if i in self._cache:
            return self._cache[i]
        out = self.transform.prepare(load_image(self.images[i]))
        if self.cache_images:
            self._cache[i] = out
        return out

    def _image(self, i: int, texts: list[str], g: torch.Generator) -> torch.Tensor:
        return self.transform.finish(self._prepared(i), texts=texts, generator=g)

    # ---- text rows ----
    def _cached_ids(self, kind: str, text: str, encode: Callable[[str], list[int]]) -> list[int]:
        ids = self._ids.get((kind, text))
        if ids is None:
            ids = encode(text)
            if len(self._ids) < 1_000_000:  # bounded: VQA v2 has ~450k distinct questions and answers
                self._ids[(kind, text)] = ids
        return ids

    def _encode(self, text: str) -> list[int]:
        return self._cached_ids("text", text, self.tok.encode)

    def _row(self, prompt: list[int], target_text: str, task: str, meta: dict) -> dict:
        target = [*self._encode(target_text), self.tok.eos_id]
        room = self.max_len - len(prompt)
        if room < 1:
            raise ConfigError(f"max_len={self.max_len} leaves no room for a target after a {len(prompt)}-token prompt")
        if len(target) > room:
            target = target[: room - 1] + [self.tok.eos_id]  # cut the target, keep <eos> last
        return dict(
            input_ids=prompt + target, loss_mask=[False] * len(prompt) + [True] * len(target),
            task=task, meta=meta, prompt_len=len(prompt),
        )

    def _vqa_prompt(self, question: str) -> list[int]:
        return self._cached_ids("prompt", question, lambda q: self.tok.vqa_prompt(q, self.max_len))

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        rng = np.random.default_rng([self.seed, self.epoch, i])
        g = torch.Generator().manual_seed(int(rng.integers(2**62)))
        questions, captions = self.groups[i]
        rows: list[dict] = []
        if self.train:
            for k in _choose(rng, len(questions), self.qpi):
                r = questions[k]
                real = [a for a in r.answers if a]  # an annotator's empty answer is no target
                answer = real[rng.integers(len(real))]  # one of the 10: sampled by frequency
                rows.append(self._row(self._vqa_prompt(r.question), answer, "vqa", _vqa_meta(r)))
            for k in _choose(rng, len(captions), self.cpi):
                c = captions[k]
                meta = dict(image_id=c.image_id, caption_id=c.caption_id, image=str(c.image))
                rows.append(self._row(self.tok.caption_prompt(), c.caption, "caption", meta))
        else:
            for r in questions:
                target = r.multiple_choice_answer or Counter(r.answers).most_common(1)[0][0]
                rows.append(self._row(self._vqa_prompt(r.question), target, "vqa", _vqa_meta(r)))
            if captions:
                meta = dict(image_id=captions[0].image_id, image=str(captions[0].image),
                            captions=[c.caption for c in captions])
                rows.append(self._row(self.tok.caption_prompt(), captions[0].caption, "caption", meta))
        texts = [r.question for r in questions] + [c.caption for c in captions]
        return dict(image=self._image(i, texts, g), rows=rows)


def _choose(rng: np.random.Generator, n: int, k: int) -> list[int]:
    """k distinct indices out of n (all of them, shuffled, when n <= k)."""
    return [int(j) for j in rng.permutation(n)[: min(n, k)]] if n and k > 0 else []


def _vqa_meta(r: VQARecord) -> dict:
    return dict(
        question_id=r.question_id, question=r.question, answers=list(r.answers), answer_type=r.answer_type,
        question_type=r.question_type, image_id=r.image_id, image=str(r.image),
    )
