"""Texts too long for the model's context are never cut without a word. `ItemMaker` (vqa.data.dataset) cuts a
question to leave room to answer and a target to fit dec_max_len (its <eos> kept); decoding stops an answer or
a caption at its budget. Each is counted and said once per run, in one line with the share cut:
`split_cuts` over a folder split's records before it trains (a shard split: over its first samples),
`Budget` over the outputs of an evaluation (said at a run's first), each by `say`."""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Sequence

from ..logs import get_logger

SHARD_SAMPLES = 1000  # a shard split's samples read for the count: the whole split is a stream
_said: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owner -> the kinds of line it said


def line(cut: int, total: int, what: str, why: str) -> str | None:
    """'vqa: 12 of 40,000 caption targets (0.03%) <why>', or None when none was cut."""
    if not cut:
        return None
    return f"vqa: {cut:,} of {total:,} {what} ({100 * cut / total:.2f}%) {why}"


def say(text: str | None, owner: object | None = None) -> None:
    """Log `text` as a warning (None: nothing); with `owner` (a run's tokenizer: one object for the whole
    run, so a training run's evaluations say a kind of cut once), only its first line of each kind."""
    if not text:
        return
    if owner is not None:
        kind = re.sub(r"[\d,.%]+", "#", text)
        said = _said.setdefault(owner, set())
        if kind in said:
            return
        said.add(kind)
    get_logger("data").warning(text)


def _lengths(tok, texts: Iterable[str]) -> dict[str, int]:
    """Tokens of each distinct text."""
    unique = list(dict.fromkeys(texts))
    encoded = tok.hf.encode_batch(unique, add_special_tokens=False) if unique else []
    return {t: len(e.ids) for t, e in zip(unique, encoded, strict=True)}


def text_cuts(tok, max_len: int, questions: Sequence[tuple[str, Sequence[str]]], captions: Sequence[str],
              where: str = "") -> list[str]:
    """Lines for the texts `ItemMaker` would cut: `questions` as (question, its answers that train), the
    caption texts, in a context of `max_len`. `where` ends each line's noun ("of the first 1,000 samples")."""
    out = []
    if questions:
        most = tok.max_question_tokens(max_len)
        qlen = _lengths(tok, (q for q, _ in questions))
        alen = _lengths(tok, (a for _, answers in questions for a in answers))
        out.append(line(sum(qlen[q] > most for q, _ in questions), len(questions), "questions" + where,
                        f"were longer than the {most} tokens dec_max_len={max_len} leaves a question and were cut"))
        # the target (answer, <eos>) fits in what the prompt (<bos> <question> q <answer>) leaves
        cut = sum(alen[a] + 1 > max_len - 3 - min(qlen[q], most) for q, answers in questions for a in answers)
        out.append(line(cut, sum(len(answers) for _, answers in questions), "answer targets" + where,
                        f"did not fit dec_max_len={max_len} after their question and were cut"))
    if captions:
        most = max_len - len(tok.caption_prompt()) - 1  # the caption's own tokens, before <eos>
        clen = _lengths(tok, captions)
        out.append(line(sum(clen[c] > most for c in captions), len(captions), "caption targets" + where,
                        f"were longer than the {most} tokens dec_max_len={max_len} leaves a caption and were cut"))
    return [o for o in out if o]


def split_cuts(tok, max_len: int, source, tasks: Sequence[str] = ("vqa", "caption")) -> list[str]:
    """`text_cuts` over a training split: a folder split's every record (each answer an annotator gave is a
    target), a shard split's first SHARD_SAMPLES samples."""
    from .readers.shards import ShardSplit

    questions: list[tuple[str, list[str]]] = []
    captions: list[str] = []
    where = ""
    if isinstance(source, ShardSplit):
        where = f" of the first {SHARD_SAMPLES:,} samples"
        for k, s in enumerate(source.iter_all()):
            if k >= SHARD_SAMPLES:
                break
            questions += [(q["question"], [a for a in q["answers"] if a]) for q in s.qa]
            captions += s.captions
    else:
        vqa, strings = source.vqa, source.vqa.strings.items
        for k in range(len(vqa)):
            answers = vqa.answers[vqa.ans_start[k]: vqa.ans_start[k + 1]].tolist()
            questions.append((strings[vqa.question[k]], [strings[a] for a in answers if strings[a]]))
        captions = list(source.captions.caption)
    return text_cuts(tok, max_len, questions if "vqa" in tasks else [], captions if "caption" in tasks else [],
                     where)


class Budget:
    """Outputs of an evaluation that reached their budget (`GenerationConfig.budget`: max_new_tokens, or the
    context left after the prompt) without <eos>, so were cut, per task; and questions cut to fit."""

    def __init__(self, tok, max_len: int):
        self.tok, self.max_len = tok, int(max_len)
        self.seen = {"vqa": 0, "caption": 0}
        self.cut = {"vqa": 0, "caption": 0}
        self.questions_cut = 0

    def add(self, task: str, prompt: Sequence[int], output: Sequence[int], config, question: str | None = None):
        self.seen[task] += 1
        self.cut[task] += len(output) >= config.budget(self.max_len - len(prompt))
        if question is not None:
            self.questions_cut += len(self.tok.encode(question)) > self.tok.max_question_tokens(self.max_len)

    def counts(self) -> tuple:
        """What another rank's `merge` takes (plain numbers: gathered between processes)."""
        return dict(self.seen), dict(self.cut), self.questions_cut

    def merge(self, counts: tuple) -> None:
        seen, cut, questions_cut = counts
        for task in self.seen:
            self.seen[task] += seen[task]
            self.cut[task] += cut[task]
        self.questions_cut += questions_cut

    def lines(self, configs: dict) -> list[str]:
        out = [line(self.questions_cut, self.seen["vqa"], "questions evaluated",
                    f"were longer than the {self.tok.max_question_tokens(self.max_len)} tokens "
                    f"dec_max_len={self.max_len} leaves a question and were cut")]
        for task, noun in (("vqa", "answers"), ("caption", "captions")):
            if task in configs:
                most = configs[task].max_new_tokens
                budget = f"the {most}-token budget" if most is not None else "the context"
                out.append(line(self.cut[task], self.seen[task], noun + " generated",
                                f"reached {budget} (or the end of dec_max_len={self.max_len}) without <eos> and "
                                "were cut (--max-new-tokens)"))
        return [o for o in out if o]


__all__ = ["Budget", "SHARD_SAMPLES", "line", "say", "split_cuts", "text_cuts"]
