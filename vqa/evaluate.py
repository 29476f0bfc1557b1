"""`vqa eval`: run a checkpoint over a split and score it with the official metrics.

Writes the official result files (`vqa_results.json`: [{"question_id", "answer"}], `caption_results.json`:
[{"image_id", "caption"}]) and `summary.json` (VQA accuracy overall / per answer type / per question type,
BLEU-1..4 and CIDEr-D) to `<checkpoint>/eval-<split>/` unless --out says otherwise.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, Subset

from .data.dataset import ImageTextDataset, make_collate
from .data.transforms import build_transform
from .generate import generate
from .metrics import caption_scores, vqa_scores


@torch.no_grad()
def evaluate(model, tokenizer, split_data, tasks=("vqa", "caption"), device="cpu", max_images=None,
             batch_images=64, num_beams=1, progress=True) -> dict:
    """Greedy (or beam) answers and captions for the split's images; returns the summary and result lists."""
    cfg = model.cfg
    ds = ImageTextDataset(split_data, tokenizer, build_transform(cfg, train=False), cfg.dec_max_len, tasks=tasks,
                          train=False)
    if max_images is not None and max_images < len(ds):
        ds = Subset(ds, range(max_images))
    # its own generator: evaluating mid-training must not advance the global RNG (exact resume, dropout)
    loader = DataLoader(ds, batch_size=batch_images, collate_fn=make_collate(tokenizer.pad_id),
                        generator=torch.Generator().manual_seed(0))
    vqa_pred, vqa_recs, cap_pred, cap_refs = {}, [], {}, {}
    it = loader
    if progress:
        from tqdm import tqdm

        it = tqdm(loader, desc="eval", unit="batch", file=sys.stderr)
    was_training = model.training
    model.eval()
    t0 = time.time()
    for batch in it:
        memory = model.encode(batch["images"].to(device))  # each image once, for all its questions
        for task, max_new in (("vqa", 10), ("caption", cfg.dec_max_len)):
            rows = [i for i, t in enumerate(batch["task"]) if t == task]
            if not rows:
                continue
            prompts = [batch["input_ids"][i, : batch["prompt_len"][i]].tolist() for i in rows]
            out = generate(model, prompts, memory=memory, image_index=batch["image_index"][rows].to(device),
                           max_new_tokens=max_new, num_beams=num_beams)
            for i, seq in zip(rows, out.sequences, strict=True):
                meta, text = batch["meta"][i], tokenizer.decode(seq)
                if task == "vqa":
                    vqa_pred[meta["question_id"]] = text
                    vqa_recs.append(SimpleNamespace(**meta))
                else:
                    cap_pred[meta["image_id"]] = text
                    cap_refs[meta["image_id"]] = meta["captions"]
    model.train(was_training)
    summary = {"images": len(ds), "seconds": round(time.time() - t0, 1)}
    if vqa_pred:
        scores = vqa_scores(vqa_pred, vqa_recs)
        summary.update(questions=len(vqa_pred), vqa_accuracy=scores["overall"],
                       per_answer_type=scores["per_answer_type"], per_question_type=scores["per_question_type"])
    if cap_pred:
        summary.update(caption_scores(cap_pred, cap_refs))
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


def add_arguments(p) -> None:
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder or a run folder (its best/ is used)")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="val")
    p.add_argument("--tasks", default="vqa,caption")
    p.add_argument("--out", help="where to write the result files (default: <checkpoint>/eval-<split>)")
    p.add_argument("--max-images", type=int)
    p.add_argument("--beams", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="images per batch")
    p.add_argument("--device", default="auto")


def run(args) -> int:
    from . import checkpoint
    from .data.formats import load_split
    from .distributed import pick_device

    device = pick_device(args.device)
    model, tok, card = checkpoint.load(args.checkpoint, device)
    data = Path(args.data).resolve()
    if card.get("data") == str(data) and args.split == card.get("train_split"):
        print(f"vqa eval: WARNING: split '{args.split}' of {data} is the one this model was trained on; "
              "these scores say nothing about unseen data", file=sys.stderr)
    split = load_split(args.data, args.split)
    tasks = tuple(t for t in args.tasks.split(",") if t in card.get("tasks", ["vqa", "caption"]))
    res = evaluate(model, tok, split, tasks=tasks, device=device, max_images=args.max_images,
                   batch_images=args.batch_size, num_beams=args.beams)
    out = Path(args.out) if args.out else checkpoint.resolve(args.checkpoint) / f"eval-{args.split}"
    out.mkdir(parents=True, exist_ok=True)
    s = res["summary"]
    s.update(checkpoint=str(checkpoint.resolve(args.checkpoint)), data=str(data), split=args.split)
    for name in ("vqa_results", "caption_results"):
        if res[name]:
            (out / f"{name}.json").write_text(json.dumps(res[name]))
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    print(format_summary(s))
    print(f"results written to {out}")
    return 0


def format_summary(s: dict) -> str:
    lines = [f"{s['images']} images in {s['seconds']} s"]
    if "vqa_accuracy" in s:
        lines.append(f"VQA accuracy: {s['vqa_accuracy']:.2f}  ({s['questions']} questions)")
        for title, key in (("answer type", "per_answer_type"), ("question type", "per_question_type")):
            lines.append(f"  per {title}:")
            lines += [f"    {k:<24} {v:6.2f}" for k, v in sorted(s[key].items())]
    for k in ("BLEU-4", "CIDEr-D"):
        if k in s:
            lines.append(f"caption {k}: {s[k]:.3f}")
    return "\n".join(lines)
