"""Evaluation: run a model over a split and score it with the official metrics (the `vqa eval` command is
`vqa.evaluation.cli`).

`evaluate` decodes every question (and one caption per image) with the task's GenerationConfig (greedy unless
given: training's evaluations, for speed; `vqa eval` gives what is served, `GenerationConfig.served`), never
generating a special token but <eos> (the tokenizer's `never_generated`), and returns the summary (VQA
accuracy overall / per answer type / per question type, each question scored by its benchmark's rules
(`answer_rules`), BLEU-1..4, CIDEr-D, and the decoding and rules used, in words) with the result lists in the
official formats; with `paper=True` (`vqa eval`) also METEOR, ROUGE-L, the calibration of the answers'
confidence (`vqa.evaluation.calibration`) and, on a built-in set, the accuracy per template
(`vqa.evaluation.wordings`). `format_summary` prints the table papers print.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from importlib.util import find_spec
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..config import GenerationConfig
from ..data.collate import make_collate
from ..data.dataset import ItemMaker
from ..data.lengths import Budget, say
from ..data.loader import eval_dataset, unreadable_of, worker_errors
from ..data.transforms import ImageNormalizer, build_transform
from ..decoding.compiled import encode as encode_images
from ..decoding.generate import generate
from ..errors import DataError, ExtraMissing
from ..logs import bars_off, get_logger
from .answer_rules import score_answers
from .calibration import calibration_summary
from .metrics import caption_scores, start_meteor
from .wordings import format_templates, template_scores


def generation_for(tasks, generation: GenerationConfig | Mapping[str, GenerationConfig] | None) -> dict:
    """{task: GenerationConfig}: the task's defaults (`GenerationConfig.for_task`), or what was given."""
    if isinstance(generation, GenerationConfig):
        return {t: generation for t in tasks}
    given = dict(generation or {})
    return {t: given.get(t) or GenerationConfig.for_task(t) for t in tasks}


@torch.no_grad()
def evaluate(model, tokenizer, split_data, tasks=("vqa", "caption"), device="cpu", max_images=None,
             batch_images=64, generation=None, progress=True, rank: int = 0, world: int = 1,
             compile: bool = False, amp_dtype: torch.dtype | None = None, workers: int = 0,
             max_unreadable: float | None = None, need_caption_scores: bool = True, paper: bool = False,
             observers: Sequence[Callable] = (), scoring: str | None = None) -> dict:
    """Answers and captions for the split's images (the first `max_images`); returns the summary and the
    result lists. Without the eval extra (pycocoevalcap), captions are not scored: an ExtraMissing error, or
    with `need_caption_scores=False` (training's evaluations) a summary without BLEU and CIDEr-D.
    `split_data`: a folder split or a shard split (`vqa.data.sources.open_split`).
    `generation`: one GenerationConfig for every task, or {task: config}.

    Under torchrun (`world` > 1, the process group initialized) every rank decodes its share of a folder
    split's images (image i goes to rank i % world; a shard split is read by rank 0 alone) and rank 0 gathers
    the results and scores them; the other ranks return an empty summary. The model is called directly (not
    through DDP), so decoding holds no collective. `compile`: decode (and, where it pays, encode) through
    torch.compile (`vqa.decoding.compiled`; the weights are frozen in, so not for a model still in training).
    `amp_dtype`: run the model under autocast in that dtype (training's, when it evaluates); `workers`: loader
    worker processes that decode the images (a shard split is read by one); `max_unreadable`: skip unreadable
    pictures up to that share (`vqa.data.unreadable`; training's), else stop at the first. `paper`: the scores
    training's evaluations leave out (METEOR, ROUGE-L, the calibration of the answers' confidence).
    `observers`: each called as `observer(group, memory, generation)` after a group of rows is decoded (the
    rows' TaskGroup, its batch's encoded images, the Generation), on this rank's rows (`vqa eval
    --grounding`, `--consistency`). `scoring`: one `answer_rules.RULES` name for every answer (default: each
    question's benchmark's, from the format of its file)."""
    cfg = model.cfg
    gen = generation_for(tasks, generation)
    maker = ItemMaker(tokenizer, build_transform(cfg, train=False), cfg.dec_max_len, 0, 0, train=False)
    ds = eval_dataset(split_data, maker, tasks, max_images, rank=rank, world=world, max_unreadable=max_unreadable)
    normalize = ImageNormalizer(cfg.vit_mean, cfg.vit_std)
    workers = min(int(workers), 1) if isinstance(ds, IterableDataset) else max(0, int(workers))
    # its own generator: evaluating mid-training must not advance the global RNG (exact resume, dropout)
    loader = DataLoader(ds, batch_size=batch_images, collate_fn=make_collate(tokenizer.pad_id),
                        generator=torch.Generator().manual_seed(0), num_workers=workers,
                        pin_memory=torch.device(device).type == "cuda")
    autocast = torch.autocast(torch.device(device).type, dtype=amp_dtype or torch.float32,
                              enabled=amp_dtype is not None)
    vqa_pred, vqa_recs, cap_pred, cap_refs, vqa_conf = {}, [], {}, {}, {}
    it = loader
    if progress:
        from tqdm import tqdm

        it = tqdm(loader, desc="eval", unit="batch", file=sys.stderr, disable=bars_off())
    # METEOR's Java loads its tables (tens of seconds) while the model decodes; without the scorers caption_scores
    # says which extra is missing
    scorers = find_spec("pycocoevalcap") is not None
    meteor = (start_meteor() or False) if paper and "caption" in tasks and rank == 0 and scorers else None
    was_training = model.training
    model.eval()
    t0 = time.time()
    n_images, budget = 0, Budget(tokenizer, cfg.dec_max_len)
    for batch in worker_errors(iter(it)):
        n_images += batch.num_images
        images = normalize(batch.images, None, device)
        with autocast:
            memory = encode_images(model, images, compile)  # each image once, for all its questions
        for group in batch.groups:
            prompts = group.prompts()
            with autocast:
                out = generate(model, prompts, memory=memory, image_index=group.image_index[: group.rows],
                               config=gen[group.task], banned=tokenizer.never_generated, compile=compile)
                for observe in observers:
                    observe(group, memory, out)
            for meta, seq, score, prompt in zip(group.meta, out.sequences, out.scores, prompts, strict=True):
                budget.add(group.task, prompt, seq, gen[group.task], meta.get("question"))
                text = tokenizer.decode(seq)
                if group.task == "vqa":
                    vqa_pred[meta["question_id"]] = text
                    vqa_conf[meta["question_id"]] = min(1.0, math.exp(float(score)))  # P(answer, <eos>)
                    vqa_recs.append(SimpleNamespace(**meta))
                else:
                    cap_pred[meta["image_id"]] = text
                    cap_refs[meta["image_id"]] = meta["captions"]
    model.train(was_training)
    if world > 1 and (tally := unreadable_of(ds)) is not None:  # the unreadable pictures of every rank together
        tally.agree(device)
    if world > 1:  # rank 0 gathers every rank's results
        shards = [None] * world
        torch.distributed.all_gather_object(shards, (vqa_pred, vqa_recs, cap_pred, cap_refs, n_images, vqa_conf,
                                                     budget.counts()))
        if rank != 0:
            return dict(summary={}, vqa_results=[], caption_results=[])
        vqa_pred, vqa_recs, cap_pred, cap_refs, n_images, budget = {}, [], {}, {}, 0, Budget(tokenizer, cfg.dec_max_len)
        for vp, vr, cp, cr, n, vc, b in shards:
            budget.merge(b)
            vqa_pred.update(vp)
            vqa_conf.update(vc)
            vqa_recs += vr
            cap_pred.update(cp)
            cap_refs.update(cr)
            n_images += n
    if len(vqa_recs) != len(vqa_pred):  # answers are keyed by question id: a repeated id would score one twice
        qid, n = Counter(r.question_id for r in vqa_recs).most_common(1)[0]
        raise DataError(f"question_id {qid!r} is on {n} questions of this split; question ids must be unique "
                        "(each answer is scored by its question's id)")
    for line in budget.lines(gen):  # once a run: training's evaluations share its tokenizer
        say(line, owner=tokenizer)
    summary = {"images": n_images, "seconds": round(time.time() - t0, 1)}
    decoded = [t for t, done in (("vqa", vqa_pred), ("caption", cap_pred)) if done]
    if decoded:
        summary["decoding"] = {t: gen[t].describe() for t in decoded}
    if vqa_pred:
        scores, summary["scoring"] = score_answers(vqa_pred, vqa_recs, split_data, scoring)
        summary.update(questions=len(vqa_pred), vqa_accuracy=scores["overall"],
                       per_answer_type=scores["per_answer_type"], per_question_type=scores["per_question_type"])
        if paper:
            qids = list(scores["per_question"])
            summary["calibration"] = calibration_summary([vqa_conf[q] for q in qids],
                                                         [scores["per_question"][q] / 100 for q in qids])
            templates = template_scores(vqa_recs, scores["per_question"])  # a built-in set's split only
            if templates:
                summary["per_template"] = templates
    if cap_pred:
        try:
            summary.update(caption_scores(cap_pred, cap_refs, paper=paper, meteor=meteor))
        except ExtraMissing as e:
            if need_caption_scores:
                raise
            get_logger("eval").warning("%s; the captions are not scored", e)
    return dict(
        summary=summary,
        vqa_results=[{"question_id": q, "answer": a} for q, a in vqa_pred.items()],
        caption_results=[{"image_id": i, "caption": c} for i, c in cap_pred.items()],
    )


def flatten(scores: dict, sep: str = "/", prefix: str = "") -> dict:
    """Nested score dicts as one level: {"per_question_type": {"count": 44.4}} -> {"per_question_type/count": 44.4}."""
    out = {}
    for k, v in scores.items():
        if isinstance(v, dict):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


ANSWER_TYPES = ("yes/no", "number", "other")  # VQA v2's, in the order its papers print them
TASK_WORDS = {"vqa": "answers", "caption": "captions"}
CAPTION_COLUMNS = (("BLEU-4", "BLEU-4"), ("METEOR", "METEOR"), ("ROUGE-L", "ROUGE-L"), ("CIDEr", "CIDEr-D"))


def text_table(rows: list[list[str]]) -> list[str]:
    """Rows of cells as aligned lines: the first column to the left, the others to the right."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(v.rjust(w) if c else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


def format_summary(s: dict) -> str:
    """The summary as papers print it, after the decoding scored: VQA accuracy (and the benchmark rules it was
    scored by) overall and per answer type; captions' BLEU-4, METEOR, ROUGE-L and CIDEr (x100, "-" for a
    score not computed); then the calibration, the question types and their templates."""
    precision = f" ({s['precision']})" if s.get("precision", "float32") != "float32" else ""
    lines = [f"{s['images']} images in {s['seconds']} s{precision}"]
    decoding = s.get("decoding") or {}
    if decoding:
        lines.append("decoding: " + "; ".join(f"{TASK_WORDS.get(t, t)} {how}" for t, how in decoding.items()))
    if "vqa_accuracy" in s:
        types = [t for t in ANSWER_TYPES if t in s["per_answer_type"]]
        types += sorted(t for t in s["per_answer_type"] if t not in ANSWER_TYPES)
        scored = f", scored by {s['scoring']}" if s.get("scoring") else ""
        lines.append(f"VQA accuracy ({s['questions']} questions{scored}):")
        lines += text_table([["", "overall", *types],
                             ["", f"{s['vqa_accuracy']:.2f}", *(f"{s['per_answer_type'][t]:.2f}" for t in types)]])
    if "CIDEr-D" in s:
        cols = [(name, key) for name, key in CAPTION_COLUMNS if key in s or key in ("METEOR", "ROUGE-L")]
        lines.append("captions (x100):")
        lines += text_table([["", *(name for name, _ in cols)],
                             ["", *(f"{100 * s[key]:.1f}" if key in s else "-" for _, key in cols)]])
    cal = s.get("calibration")
    if cal:
        lines.append(f"calibration: ECE {cal['ece']:.2f}% ({cal['bins']} bins), mean confidence "
                     f"{cal['mean_confidence']:.2f}%")
        cov = cal["accuracy_at_coverage"]
        lines.append("  accuracy at coverage:")
        lines += text_table([["", *cov], ["", *(f"{v:.2f}" for v in cov.values())]])
    if s.get("per_question_type"):
        lines.append("  per question type:")
        lines += [f"    {k:<24} {v:6.2f}" for k, v in sorted(s["per_question_type"].items())]
    if s.get("per_template"):
        lines += format_templates(s["per_template"])
    return "\n".join(lines)


__all__ = ["evaluate", "flatten", "format_summary", "generation_for"]
