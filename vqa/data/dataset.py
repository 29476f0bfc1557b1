"""The torch dataset for VQA and captioning together, indexed by image (batches: `vqa.data.collate`).

Why by image: the encoder is the costly part, so one item is one image plus several text rows about it (up to
`questions_per_image` questions and `captions_per_image` captions); the model encodes each image once and the
decoder reads it for every row (`image_index` maps rows to images). The task mix per image is therefore
questions_per_image : captions_per_image (e.g. 4:1); images with only one kind of record give only that kind.

`ItemMaker` turns one image and its records into an item; `ImageTextDataset` (a folder's split: random
access) and `vqa.data.stream.ShardStream` (shards: streamed) both use it, so batches look the same whichever
source fed them. Items carry the image as uint8 [3,S,S] (shifted / flipped in training) and, in training,
its brightness / contrast factors: the float work happens on the device (`ImageNormalizer`).

Determinism: every random choice (which questions, which of the 10 answers, which caption, the augmentation)
comes from generators seeded by (seed, epoch, index), so a resumed run draws the same data whatever the
worker layout. The index may be given as (epoch, index): a persistent DataLoader worker keeps its copy of
the dataset for the whole run, so the epoch travels with each index instead of through `set_epoch`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import TrainConfig
from ..errors import ConfigError, InputError
from ..tokenizer import Tokenizer
from .cache import ImageCache
from .records import CaptionRecord, VQARecord
from .split import SplitData
from .transforms import ImageTransform
from .unreadable import UnreadablePictures

TASKS = ("vqa", "caption")


def check_tasks(tasks: Sequence[str]) -> None:
    unknown = set(tasks) - set(TASKS)
    if unknown:
        raise ConfigError(f"unknown task(s) {sorted(unknown)}; choose from {TASKS}")


class ItemMaker:
    """One image and its records -> an item: dict(image=uint8 [3,S,S], jitter=[2] (training only),
    rows=[dict(input_ids, loss_mask, task, meta, prompt_len)])."""

    def __init__(self, tokenizer: Tokenizer, transform: ImageTransform, max_len: int,
                 questions_per_image: int, captions_per_image: int, train: bool):
        self.tok, self.transform, self.max_len = tokenizer, transform, int(max_len)
        self.qpi, self.cpi, self.train = int(questions_per_image), int(captions_per_image), bool(train)
        self.regions = None  # a `vqa.data.regions.Regions`: training's grounded tokens (`--grounding-weight`)
        self._ids: dict[tuple[str, str], list[int]] = {}  # (kind, text) -> token ids: every epoch repeats them

    def _cached_ids(self, kind: str, text: str, encode: Callable[[str], list[int]]) -> list[int]:
        ids = self._ids.get((kind, text))
        if ids is None:
            ids = encode(text)
            if len(self._ids) < 1_000_000:  # bounded: VQA v2 has ~450k distinct questions and answers
                self._ids[(kind, text)] = ids
        return ids

    def _row(self, prompt: list[int], target_text: str, task: str, meta: dict) -> dict:
        target = [*self._cached_ids("text", target_text, self.tok.encode), self.tok.eos_id]
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

    def rows(self, rng: np.random.Generator, n_questions: int, question: Callable[[int], VQARecord],
             n_captions: int, caption: Callable[[int], CaptionRecord],
             all_captions: list[str] | None = None) -> list[dict]:
        """Text rows of one image with `n_questions` questions and `n_captions` captions (`question(k)` /
        `caption(k)` give the k-th): in training up to questions_per_image random questions, each with one of
        its answers drawn by frequency, and captions_per_image random captions; in evaluation every question
        (target: the most common answer) and one caption row holding all the references."""
        questions: list[tuple[str, str, dict]] = []  # (question, target, meta)
        for k in _choose(rng, n_questions, self.qpi) if self.train else range(n_questions):
            r = question(k)
            real = [a for a in r.answers if a]  # an annotator's empty answer is no target
            if self.train:
                if not real:
                    continue
                target = real[rng.integers(len(real))]  # one of the 10: sampled by frequency
            else:
                target = r.multiple_choice_answer or (Counter(real).most_common(1)[0][0] if real else "")
            questions.append((r.question, target, vqa_meta(r)))
        captions: list[tuple[str, dict]] = []
        for k in _choose(rng, n_captions, self.cpi) if self.train else range(min(n_captions, 1)):
            c = caption(k)
            if self.train:
                meta = dict(image_id=c.image_id, caption_id=c.caption_id, image=str(c.image), caption=c.caption)
            else:
                meta = dict(image_id=c.image_id, image=str(c.image), captions=list(all_captions or [c.caption]))
            captions.append((c.caption, meta))
        out = [self._row(self._vqa_prompt(q), t, "vqa", m) for q, t, m in questions]
        out += [self._row(self.tok.caption_prompt(), c, "caption", m) for c, m in captions]
        return out

    def item(self, image: torch.Tensor, rows: list[dict], texts: list[str], g: torch.Generator) -> dict:
        x, jitter, moves = self.transform.augment_moves(image, texts=texts, generator=g)
        if self.regions is not None:
            self.regions.attach(rows, moves)
        out = dict(image=x, rows=rows)
        if jitter is not None:
            out["jitter"] = jitter
        return out

    def skipped(self, g: torch.Generator) -> dict:
        """The item of a picture that could not be read: the padding colour and no rows (it trains nothing)."""
        t = self.transform
        blank = torch.tensor(t.fill, dtype=torch.uint8).view(3, 1, 1).expand(3, t.size, t.size).clone()
        return self.item(blank, [], [], g)


def item_generators(seed: int, epoch: int, key: int | Sequence[int]) -> tuple[np.random.Generator, torch.Generator]:
    """The item's two generators, from (seed, epoch, key) only."""
    rng = np.random.default_rng([seed, epoch, *([key] if isinstance(key, int) else key)])
    return rng, torch.Generator().manual_seed(int(rng.integers(2**62)))


class ImageTextDataset(Dataset):
    """A folder split's images, each with its questions and captions. Items as `ItemMaker.item`."""

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
        image_cache: ImageCache | None = None,
        unreadable: UnreadablePictures | None = None,
    ):
        """`unreadable`: skip a picture that cannot be read and tally it there (training); None: raise its
        InputError."""
        check_tasks(tasks)
        self.maker = ItemMaker(tokenizer, transform, max_len, questions_per_image, captions_per_image, train)
        self.tok, self.transform, self.train = tokenizer, transform, bool(train)
        self.seed, self.epoch = int(seed), 0
        self.data = split_data
        use_vqa = "vqa" in tasks and (self.maker.qpi > 0 or not train)
        use_cap = "caption" in tasks and (self.maker.cpi > 0 or not train)
        vqa, caps = split_data.vqa, split_data.captions
        n_all = len(split_data.image_files)
        q_img = vqa.image if use_vqa else np.zeros(0, np.int32)
        c_img = caps.image if use_cap else np.zeros(0, np.int32)
        # rows grouped by image (CSR): image j's questions are q_order[q_start[j]:q_start[j + 1]]
        self.q_order = np.argsort(q_img, kind="stable")
        self.q_start = np.concatenate([[0], np.cumsum(np.bincount(q_img, minlength=n_all))])
        self.c_order = np.argsort(c_img, kind="stable")
        self.c_start = np.concatenate([[0], np.cumsum(np.bincount(c_img, minlength=n_all))])
        used = (self.q_start[1:] > self.q_start[:-1]) | (self.c_start[1:] > self.c_start[:-1])
        self.image_ids = np.flatnonzero(used)  # item i -> index into split_data.image_files
        self.n_questions = int(len(q_img))
        self.n_captions = int(len(c_img))
        self.image_cache = image_cache
        self.unreadable = unreadable

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def images(self) -> list[str]:
        """The image file of every item, in item order (what an image cache is built for)."""
        paths = self.data.image_files.paths
        return [paths[j] for j in self.image_ids.tolist()]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _prepared(self, i: int) -> torch.Tensor | None:
        """The model's uint8 input [3, S, S] (`ImageTransform.prepare`), from the image cache when there is
        one; None for a picture that cannot be read, when `unreadable` tallies them."""
        cache = self.image_cache
        if cache is not None:
            x = cache.get(i)
            if x is not None:
                return x
        try:
            x = self.transform.prepare(self.data.image_files.paths[self.image_ids[i]])
        except InputError as e:
            if self.unreadable is None:
                raise
            self.unreadable.add(i, str(e))
            return None
        if cache is not None:
            cache.put(i, x)
        return x

    def records(self, i: int) -> tuple[list[int], list[int]]:
        """Row indices (into the split's vqa and caption tables) of item i's image."""
        j = int(self.image_ids[i])
        return (self.q_order[self.q_start[j] : self.q_start[j + 1]].tolist(),
                self.c_order[self.c_start[j] : self.c_start[j + 1]].tolist())

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, i = key if isinstance(key, tuple) else (self.epoch, key)
        if not 0 <= i < len(self):
            raise IndexError(i)
        rng, g = item_generators(self.seed, epoch, i)
        image = self._prepared(i)
        if image is None:
            return self.maker.skipped(g)
        qs, cs = self.records(i)
        vqa, caps = self.data.vqa, self.data.captions
        all_caps = None if self.train else [caps.caption[k] for k in cs]
        rows = self.maker.rows(rng, len(qs), lambda k: vqa[qs[k]], len(cs), lambda k: caps[cs[k]], all_caps)
        return self.maker.item(image, rows, self.texts(qs, cs), g)

    def texts(self, qs: list[int], cs: list[int]) -> list[str]:
        """Every text of an image, for the flip guard (`mentions_left_right`): each question, each of its
        answers (every annotator's and the chosen one) and each caption. Empty when flips are off."""
        if not self.transform.allow_hflip:
            return []
        vqa, s = self.data.vqa, self.data.vqa.strings
        out = ([s[vqa.question[k]] for k in qs] + [s[vqa.mc[k]] for k in qs]
               + [self.data.captions.caption[k] for k in cs])
        return out + [s[a] for k in qs for a in vqa.answers[vqa.ans_start[k] : vqa.ans_start[k + 1]].tolist()]


def _choose(rng: np.random.Generator, n: int, k: int) -> list[int]:
    """k distinct indices out of n (all of them, shuffled, when n <= k)."""
    return [int(j) for j in rng.permutation(n)[: min(n, k)]] if n and k > 0 else []


def vqa_meta(r: VQARecord) -> dict:
    return dict(
        question_id=r.question_id, question=r.question, answers=list(r.answers), answer_type=r.answer_type,
        question_type=r.question_type, image_id=r.image_id, image=str(r.image),
    )


__all__ = ["ImageTextDataset", "ItemMaker", "item_generators", "check_tasks", "vqa_meta", "TASKS"]

