"""`vqa eval`: score a checkpoint on a split with the official metrics.

    vqa eval --checkpoint runs/tiny --data data/shapes --split val [--method beam --num-beams 3]
    vqa eval ... --int8                  # the accuracy of dynamic int8 inference (CPU), compiled as it runs fast
    vqa eval ... --grounding --consistency   # Shapes / Scenes: attention on the named object, counterfactual pairs

Writes the official result files (`vqa_results.json`: [{"question_id", "answer"}], `caption_results.json`:
[{"image_id", "caption"}]), `summary.json` (with the answers' calibration) and `reliability.png` (its
reliability diagram) to `<checkpoint>-eval-<split>/` beside the checkpoint (runs/tiny/best-eval-val:
outside the checkpoint folder, which training replaces whole at every save) unless --out says otherwise.
With --grounding / --consistency / --pointing (a Shapes or Scenes folder) also `grounding.json` /
`consistency.json` / `pointing.json` (`vqa.evaluation.grounding`, `.consistency`, `.pointing`). On a built-in
set's split the table breaks each question type down by template (`vqa.evaluation.wordings`).

Decoding is what `vqa ask` / `vqa caption` serve unless the decoding options say otherwise
(`GenerationConfig.served`: answers by beam search over 3 beams at length penalty 0, at most 10 tokens;
captions greedy); the options apply to both tasks, as on `vqa ask`. Each question is scored by its
benchmark's own rules (`vqa.evaluation.answer_rules`: VQA v2, TextVQA, VizWiz, GQA, from the format of its
file) unless --scoring names one. The table and summary.json say which decoding and which rules were used.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import GenerationConfig, parse_tasks
from ..errors import ConfigError
from ..identity import checkpoint_identity
from ..logs import get_logger
from ..options import add_dataclass_arguments, check_out_folder, given
from .answer_rules import RULES


def add_arguments(p) -> None:
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder or a run folder (its best/ is used), or "
                   "a Hugging Face Hub name (user/name)")
    p.add_argument("--revision", default=None, metavar="REV",
                   help="with a Hugging Face Hub name: the branch, tag or commit to load (as user/name@REV)")
    p.add_argument("--data", required=True)
    p.add_argument("--split", help="the split to score (default: 'val', else the one split named val..., e.g. "
                   "val2014), or a shard pattern")
    p.add_argument("--tasks", help="vqa, caption or both (default: the tasks the model was trained on)")
    p.add_argument("--out", help="where to write the result files (default: <checkpoint>-eval-<split> beside the "
                   "checkpoint folder, e.g. runs/tiny/best-eval-val)")
    p.add_argument("--max-images", type=int, metavar="N", help="score only the split's first N images (default: all)")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="images per batch (default 64)")
    p.add_argument("--device", default="auto")
    p.add_argument("--int8", action="store_true",
                   help="score the model with dynamic int8 linear layers (CPU), as `vqa ask --int8` runs it")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="decode through the torch.compile'd step and image encoder: "
                        "faster after seconds of compiling per batch shape (default: with --int8, whose eager "
                        "matmuls are slower than float32's)")
    p.add_argument("--grounding", action="store_true",
                   help="Shapes / Scenes: score the cross-attention behind each word that names an object against "
                        "its box, per layer and head (grounding.json)")
    p.add_argument("--consistency", action="store_true",
                   help="Shapes / Scenes: ask counterfactual twins of the questions (picture mirrored, object "
                        "recoloured, object removed) and score the pairs (consistency.json)")
    p.add_argument("--pointing", action="store_true",
                   help="Shapes / Scenes: point at each object a name picks out as Predictor.point does (the "
                        "peak of the attention behind \"what color is the X?\") and score it against the "
                        "object's box (pointing.json)")
    p.add_argument("--scoring", choices=("auto", *RULES), default="auto",
                   help="whose rules score the answers (default auto: each question's benchmark's, from its file's "
                        "format; VQA v2's for VQA v2, OK-VQA, JSONL and shards)")
    add_dataclass_arguments(p, GenerationConfig, title="decoding (default: as `vqa ask` / `vqa caption` serve: "
                                                      "answers by beam search over 3 beams, captions greedy)")
    p._option_string_actions["--method"].help = "decoding method (default: beam for answers, greedy for captions)"
    p._option_string_actions["--length-penalty"].help = ("beam: hypotheses rank by log-probability / length ** "
                                                         "this (default: 0, the total log-probability, for "
                                                         "answers; 1.0 for captions)")


def run(args) -> int:
    from ..data.ids import check_ids
    from ..data.readers.formats import pick_split
    from ..data.sources import is_pattern, list_splits, open_split
    from ..device import pick_device
    from ..weights import checkpoint
    from ..weights.hub import is_hub_name, split_name
    from .evaluate import evaluate, format_summary

    for flag, value in (("--batch-size", args.batch_size), ("--max-images", args.max_images)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if args.out:
        check_out_folder("--out", args.out)
    changes = given(args, GenerationConfig)
    generation = {t: GenerationConfig.served(t, **changes) for t in ("vqa", "caption")}  # as `vqa ask` decodes
    device = pick_device(args.device)
    folder = checkpoint.resolve(args.checkpoint, args.revision)  # a Hub name: downloaded once, here
    model, tok, card = checkpoint.load(folder, device)
    precision = "float32"
    if args.int8:
        from ..decoding.precision import apply_precision

        precision, notice = apply_precision(model, "int8", device)
        if notice:
            get_logger("eval").warning(f"vqa eval: {notice}")
    trained = tuple(card.get("tasks") or ("vqa", "caption"))
    tasks = parse_tasks(args.tasks) if args.tasks else trained
    untrained = [t for t in tasks if t not in trained]
    if untrained:
        raise ConfigError(f"--tasks {','.join(tasks)}: the model was trained on {','.join(trained)} only, "
                          f"not {','.join(untrained)}")
    data = args.data if is_pattern(args.data) else str(Path(args.data).resolve())
    name = args.split
    if name is None:
        splits = list_splits(args.data)
        name = pick_split(splits, "val", args.data, "--split")
        if name is None:
            raise ConfigError(f"{args.data}: no split is called val or val...; choose one with --split "
                              f"(the splits found are: {', '.join(splits)})")
    if card.get("data") == data and name == card.get("train_split"):
        get_logger("eval").warning(f"vqa eval: WARNING: split '{name}' of {data} is the one this model was trained "
                                   "on; these scores say nothing about unseen data")
    split = open_split(args.data, name)
    check_ids(split, tasks, args.max_images)  # a repeated id stops here, before any decoding
    observers = synthetic_observers(args, model, tok, name, tasks)
    compile = precision == "int8" if args.compile is None else args.compile
    res = evaluate(model, tok, split, tasks=tasks, device=device, max_images=args.max_images,
                   batch_images=args.batch_size, generation=generation, compile=compile, paper=True,
                   observers=list(observers.values()), scoring=None if args.scoring == "auto" else args.scoring)
    label = name if not is_pattern(name) else "shards"
    # beside the checkpoint, not in it: a save replaces the checkpoint folder whole (best/ at each new best); a
    # Hub model's beside the command, never in the Hugging Face cache
    beside = Path(split_name(args.checkpoint)[0].replace("/", "--")) if is_hub_name(args.checkpoint) else folder
    out = Path(args.out) if args.out else beside.with_name(f"{beside.name}-eval-{label}")
    out.mkdir(parents=True, exist_ok=True)
    s = res["summary"]
    s.update(checkpoint=str(folder), model=checkpoint_identity(folder), step=card.get("step"), data=data, split=name,
             precision=precision, generation={t: generation[t].to_dict() for t in tasks})
    for name in ("vqa_results", "caption_results"):
        if res[name]:
            (out / f"{name}.json").write_text(json.dumps(res[name]))
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    if "calibration" in s:
        from .calibration import plot_reliability

        plot_reliability(s["calibration"], out / "reliability.png")
    print(format_summary(s))
    from . import consistency, grounding, pointing

    formats = dict(grounding=grounding.format_grounding, consistency=consistency.format_consistency,
                   pointing=pointing.format_pointing)
    for kind, observer in observers.items():  # each its JSON file and its table
        result = (observer.ask(model, generation["vqa"], device, args.batch_size, compile) if kind == "consistency"
                  else observer.summary())
        (out / f"{kind}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(formats[kind](result))
    print(f"results written to {out}")
    return 0


def synthetic_observers(args, model, tok, split: str, tasks) -> dict:
    """{"grounding": Grounding, "consistency": Consistency, "pointing": Pointing}, as asked, for `evaluate` to
    show its rows to."""
    from ..data.sources import is_pattern

    flags = [f for f, on in (("--grounding", args.grounding), ("--consistency", args.consistency),
                             ("--pointing", args.pointing)) if on]
    if not flags:
        return {}
    if is_pattern(args.data) or is_pattern(split):
        raise ConfigError(f"{flags[0]} needs a Shapes or Scenes folder as --data, not a shard pattern")
    if (args.consistency or args.pointing) and "vqa" not in tasks:
        raise ConfigError(f"{flags[-1]} asks questions: it needs the vqa task (--tasks vqa or both)")
    from ..data.synthetic.scene_objects import load_scenes

    scenes = load_scenes(args.data, split, flags[0])
    from . import consistency, grounding, pointing

    made = dict(grounding=lambda: grounding.Grounding(model, tok, scenes),
                consistency=lambda: consistency.Consistency(tok, scenes),
                pointing=lambda: pointing.Pointing(model, tok, scenes))
    return {kind: make() for kind, make in made.items() if getattr(args, kind)}
