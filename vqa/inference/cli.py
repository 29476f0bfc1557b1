"""`vqa ask` and `vqa caption`: one image, one question or caption, printed as text or JSON.

    vqa ask --checkpoint runs/tiny image.png "what color is the circle?" [--top-k 3] [--json]
    vqa caption --checkpoint runs/tiny image.png [--method beam --num-beams 3 | --method sample --top-p 0.9]
    vqa ask ... --attention-out DIR      # also every attention weight behind the answer: .npz + PNG pictures
    vqa ask ... --int8                   # dynamic int8 linear layers (CPU)

Collections (`vqa.inference.collection.job`): images, folders, globs, lists of paths and shards in, JSON Lines out,
batched, resumable, and dealt to ranks under torchrun:

    vqa caption --checkpoint runs/tiny photos/ more/*.jpg shards/{00000..00009}.tar --out captions.jsonl
    vqa ask --checkpoint runs/tiny --questions questions.jsonl --out answers.jsonl
    vqa ask --checkpoint runs/tiny photos/ "what is in the picture?" --out answers.jsonl
    vqa ask --checkpoint runs/tiny photos/ "the red star" --point --out points.jsonl   # Predictor.point_batch
    vqa caption --merge captions.jsonl   # the part files of a multi-machine run, into one file

The decoding options are GenerationConfig's fields (`vqa caption --help` lists them). On `vqa ask`,
`--top-k` is the number of answers to list, so sampling's top-k is `--sample-top-k` there.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from ..config import GenerationConfig
from ..errors import CheckpointError, ConfigError
from ..options import add_dataclass_arguments, given
from .collection.cli import ASK_RENAME, add_collection_arguments, check_options, run_collection, single_image

DEFAULT_CHECKPOINT = "runs/tiny"


def add_arguments(p: argparse.ArgumentParser, name: str = "ask") -> None:
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, metavar="RUN",
                   help=f"a run or checkpoint folder (default: {DEFAULT_CHECKPOINT}), or a Hugging Face Hub name "
                        "(user/name)")
    p.add_argument("--revision", default=None, metavar="REV",
                   help="with a Hugging Face Hub name: the branch, tag or commit to load (as user/name@REV)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: CUDA, else MPS, else CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--int8", action="store_true",
                   help="dynamic int8 linear layers (CPU; where int8 cannot run: a notice and float32). One answer "
                        "runs them eagerly, a collection compiled (needs the int8 extra: pip install 'vqa[int8]')")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="the weights' dtype (default auto: bf16 on GPUs with bf16 tensor cores, fp32 elsewhere)")
    p.add_argument("--attention-out", metavar="DIR", default=None,
                   help="write the attention behind the result into DIR: attention.npz (the decoder's masked "
                        "self-attention, cross-attention weights and raw scores, the ViT's self-attention) and "
                        "the attention explorer's pictures as PNG")
    rename = None
    if name == "ask":
        p.add_argument("inputs", nargs="*", metavar="INPUT",
                       help="INPUT... QUESTION: an image, or many (folders, globs, lists of paths, shards), and "
                            "last the question, quoted")
        p.add_argument("--questions", metavar="Q.jsonl", default=None,
                       help='questions file: one {"image", "question"[, "question_id"]} a line, images relative '
                            "to the file (instead of INPUT... QUESTION)")
        p.add_argument("--top-k", type=int, default=1, metavar="K", help="also list the K most likely answers")
        p.add_argument("--point", action="store_true",
                       help='INPUT... OBJECT: where the model looks for the named object ("the red star"), a point '
                            "and a box in the picture's pixels, or that it says there is none (Predictor.point); "
                            "with many INPUTs, --out or --questions (each question the object): one JSON line each")
        rename = ASK_RENAME
    else:
        p.add_argument("inputs", nargs="*", metavar="INPUT",
                       help="an image; or many: folders (recursively), globs, text files of paths, webdataset / "
                            "parquet shards (shards/{00000..00099}.tar)")
    add_collection_arguments(p)
    add_dataclass_arguments(p, GenerationConfig, rename=rename,
                            title="decoding (answers: beam search over max(K, 3) beams by default; captions: greedy)")
    # GenerationConfig's own default (greedy) is the captions'; answers default to beam search
    p._option_string_actions["--method"].help = ("decoding method (default: beam for answers, over max(K, 3) beams "
                                                  "for --top-k K; greedy for captions)")


def _load(args, compile: bool | None = False, device=None):
    from .predict import Predictor

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            pred = Predictor.from_pretrained(args.checkpoint, device=device or args.device, revision=args.revision,
                                             quantize="int8" if args.int8 else None,
                                             dtype=None if args.precision == "auto" else args.precision,
                                             compile=compile)  # one answer: compiling costs more than it saves
        for w in caught:  # int8 that cannot run here: one line on stderr, then float32
            print(f"vqa {args.command}: {w.message}", file=sys.stderr)
        return pred
    except CheckpointError as e:
        from ..weights.hub import is_hub_name

        hint = ""
        if not Path(args.checkpoint).exists() and not is_hub_name(args.checkpoint):
            hint = ("; train one with `vqa data shapes --out data/shapes` and then "
                    "`vqa train --data data/shapes --out runs/tiny`")
        raise CheckpointError(f"{e}{hint}") from None


def _attention_out(pred, args, res) -> dict:
    """Write the explanation of `res` into --attention-out (if given); the JSON fields that say so."""
    if not args.attention_out:
        return {}
    files = pred.explain(args.image, result=res).save(args.attention_out)
    if not args.json:
        print(f"(attention: {len(files)} files in {args.attention_out})", file=sys.stderr)
    return dict(attention_out=str(args.attention_out), attention_files=[f.name for f in files])


def run(args) -> int:
    check_options(args)
    if getattr(args, "point", False) and args.top_k != 1:
        raise ConfigError("--point finds one point per picture and object: no --top-k")
    if not single_image(args):
        return run_collection(args, _load)
    args.image = args.inputs[0]
    if args.command == "ask":
        args.question = args.inputs[1]
    pred = _load(args, compile=bool(args.compile))  # one image: compiled only when --compile asks for it
    from .pointing import object_words
    from .streaming import print_stream
    if args.command == "ask" and args.point:
        found = pred.point(args.image, args.question, **given(args, GenerationConfig, ASK_RENAME))
        if args.json:
            print(json.dumps(dict(image=str(args.image), **found.to_dict()), ensure_ascii=False))
        elif not found.found:
            print(f"no {object_words(args.question)} in the picture")
        else:
            (x, y), box = found.point, found.box
            print(f"point {x:.0f} {y:.0f}  box {box[0]:.0f} {box[1]:.0f} {box[2]:.0f} {box[3]:.0f}")
        return 0
    ask = args.command == "ask"  # an answer or a caption, printed as it is decoded on a terminal
    kw = given(args, GenerationConfig, ASK_RENAME if ask else None)
    if ask:
        kw = dict(question=args.question, top_k=args.top_k, generation=pred.answer_settings(args.top_k, changes=kw))
    else:  # settled here: `stream` reads a bare top_k as the answers to list, not the sampling's
        kw = dict(generation=pred.caption_settings(changes=kw))
    if _streams(args):
        res = print_stream(pred.stream(args.image, **kw), sys.stdout)
    else:
        res = (pred.answer if ask else pred.caption)(args.image, **kw)
    written = _attention_out(pred, args, res)
    if args.json:
        print(json.dumps(dict(image=str(args.image), **res.to_dict(), **written), ensure_ascii=False))
        if ask:  # the JSON holds the top answers and whether the question was cut; stderr says a cut answer
            _say_cut(res, "answer")
            return 0
    elif not _streams(args):
        print(res.answer if ask else res.caption)
    if ask and args.top_k > 1:
        width = max(len(a) for a, _ in res.top_k)
        for i, (a, p) in enumerate(res.top_k, 1):
            print(f"  {i}. {a:<{width}}  {100 * p:5.1f}%")
    if ask and res.truncated:
        print(f"(the question was cut to {pred.tokenizer.max_question_tokens(pred.cfg.dec_max_len)} tokens to fit "
              "the model)")
    _say_cut(res, "answer" if ask else "caption")
    return 0


def _streams(args) -> bool:
    """Text on a terminal is printed as it is decoded; JSON and a pipe get the whole text at once."""
    return not args.json and sys.stdout.isatty()


def _say_cut(res, what: str) -> None:
    if res.cut:
        print(f"vqa: the {what} reached its {len(res.ids)}-token budget without <eos> and was cut "
              "(--max-new-tokens)", file=sys.stderr)
