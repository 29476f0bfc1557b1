"""`vqa ask` and `vqa caption`: one image, one question or caption, printed as text or JSON.

    vqa ask --checkpoint runs/tiny image.png "what color is the circle?" [--top-k 3] [--json]
    vqa caption --checkpoint runs/tiny image.png [--beams 3 | --sample --top-p 0.9] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .errors import CheckpointError

DEFAULT_CHECKPOINT = "runs/tiny"


def add_arguments(p: argparse.ArgumentParser, name: str = "ask") -> None:
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, metavar="RUN",
                   help=f"a run or checkpoint folder (default: {DEFAULT_CHECKPOINT})")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: CUDA, else MPS, else CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("image", metavar="IMAGE", help="an image file")
    if name == "ask":
        p.add_argument("question", metavar="QUESTION", help="the question, quoted")
        p.add_argument("--top-k", type=int, default=1, metavar="K", help="also list the K most likely answers")
        p.add_argument("--beams", type=int, default=None, metavar="N",
                       help="beam width for the answers (default: max(K, 3))")
    else:
        mode = p.add_mutually_exclusive_group()
        mode.add_argument("--beams", type=int, default=1, metavar="N", help="beam search with N beams (default: greedy)")
        mode.add_argument("--sample", action="store_true", help="sample instead of searching")
        p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="sampling: nucleus probability (default 1)")
        p.add_argument("--top-k", type=int, default=0, metavar="K", help="sampling: keep the K likeliest tokens (0: all)")
        p.add_argument("--temperature", type=float, default=1.0, metavar="T", help="sampling temperature (default 1)")
        p.add_argument("--seed", type=int, default=None, help="sampling: a seed for a reproducible caption")
        p.add_argument("--max-new-tokens", type=int, default=None, metavar="N", help="longest caption, in tokens")


def _load(args):
    from .predict import Predictor

    try:
        return Predictor.from_pretrained(args.checkpoint, device=args.device)
    except CheckpointError as e:
        hint = ""
        if not Path(args.checkpoint).exists():
            hint = "; train one with `make demo` or `vqa train --data data/shapes --out runs/tiny`"
        raise CheckpointError(f"{e}{hint}") from None


def run(args) -> int:
    pred = _load(args)
    if args.command == "ask":
        res = pred.answer(args.image, args.question, top_k=args.top_k, num_beams=args.beams)
        if args.json:
            print(json.dumps(dict(image=str(args.image), **res.to_dict()), ensure_ascii=False))
            return 0
        print(res.answer)
        if args.top_k > 1:
            width = max(len(a) for a, _ in res.top_k)
            for i, (a, p) in enumerate(res.top_k, 1):
                print(f"  {i}. {a:<{width}}  {100 * p:5.1f}%")
        if res.truncated:
            print(f"(the question was cut to {pred.cfg.dec_max_len - 5} tokens to fit the model)")
        return 0
    res = pred.caption(args.image, num_beams=args.beams, do_sample=args.sample, top_p=args.top_p, top_k=args.top_k,
                       temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens)
    if args.json:
        print(json.dumps(dict(image=str(args.image), **res.to_dict()), ensure_ascii=False))
    else:
        print(res.caption)
    return 0
