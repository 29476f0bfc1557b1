"""`vqa pretrain`: build the pretraining corpus (`vqa.data.synthetic.corpus`) and train the tiny preset's towers
on it from random weights, with the ordinary trainer, into a run folder that `vqa train --init-from DIR` starts from.

DIR holds the run (best/, last/, metrics.jsonl: a run folder like any other), the corpus in DIR/corpus with its
tokenizer (BPE on the corpus text plus every printable ASCII character, so that a fine-tuning set's new words
are sub-words, and the 256 byte tokens, so that any other character is its UTF-8 bytes, never <unk>) and
DIR/pretrain.json (the command, corpus, steps, seconds). With --max-steps the run is reproducible: the same
seed gives the same weights on the same machine; an interrupted one continues where it stopped when the
command is given again.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import time
from pathlib import Path

from ..errors import ConfigError
from ..options import check_out_folder

DEFAULT_STEPS = 2500  # the shipped towers' length (vqa/weights/tiny/card.json), which fine-tuning starts from
DEFAULT_IMAGES = 40000
DEFAULT_THINGS_SHARE = 0.3
DEFAULT_GROUNDING = 1.0  # the grounding loss (`vqa.data.regions`) on the corpus's objects: on, as the shipped towers
ALPHABET = string.ascii_lowercase + string.digits + string.punctuation
# the corpus's four captions of an image all train each step (the listing, the tally, two relations), each
# token weighted as an answer's: the captions are what pretraining teaches
# the recipe on every device: a GPU would otherwise take 256 images a step (its memory-sized default), another run
PRETRAIN_FLAGS = dict(preset="tiny", batch_size=32, captions_per_image=4, caption_weight=1.0, from_scratch=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Build the pretraining corpus (procedural pictures: 12 kinds of objects, fills, textures, backgrounds, "
        "overlaps, drawing styles; dense captions, relation statements and questions; docs/pretraining.md) "
        f"and train the tiny preset's encoder and decoder on it from random weights, by default on {DEFAULT_IMAGES:,} "
        f"pictures for {DEFAULT_STEPS:,} steps (how long that takes: docs/pretraining.md). It makes DIR: a run "
        "folder (best/, last/, metrics.jsonl) that `vqa train --init-from DIR` fine-tunes, the corpus in DIR/corpus "
        "and DIR/pretrain.json. Giving the command again continues an interrupted run. The tiny preset's shipped "
        "towers (vqa/weights/tiny) were made by it with the defaults; `python scripts/ship_weights.py DIR` replaces "
        "them in a checkout.")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="the folder it makes")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--max-steps", type=int, default=None,
                        help=f"optimizer steps (default {DEFAULT_STEPS:,}): the same seed gives the same weights")
    length.add_argument("--minutes", type=float, default=None,
                        help="train for this long instead (the steps then depend on the machine's speed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus, the weights and the data order")
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                   help=f"corpus training pictures (default {DEFAULT_IMAGES:,})")
    p.add_argument("--val-images", type=int, default=500,
                   help="corpus validation pictures, scored during the run (default 500)")
    p.add_argument("--schedule", choices=("cosine", "noam"), default="cosine",
                   help="the learning-rate schedule after the warmup (default cosine; see vqa train --help)")
    p.add_argument("--grounding-weight", type=float, default=DEFAULT_GROUNDING,
                   help="loss weight of the words that name an object, trained to look at it (the corpus knows "
                        f"every object's box; vqa train --help; default {DEFAULT_GROUNDING:g}, 0: off)")
    p.add_argument("--things", type=Path, default=None, metavar="DIR",
                   help="a things folder (pictures of real kinds of things, scripts/make_things.py): part of the "
                        "corpus shows them, named, placed and asked about (docs/pretraining.md)")
    p.add_argument("--things-share", type=float, default=DEFAULT_THINGS_SHARE, metavar="X",
                   help=f"with --things, the share of corpus pictures drawn from it (default {DEFAULT_THINGS_SHARE:g})")
    p.add_argument("--workers", type=int, default=None, help="corpus rendering processes (default: CPU count, max 8)")


def build_corpus(folder: Path, images: int, val_images: int, seed: int, workers: int | None = None,
                 progress: bool = True, things: Path | None = None, things_share: float = DEFAULT_THINGS_SHARE) -> Path:
    """The corpus and its tokenizer in `folder`, built unless a finished build with these settings is there;
    with `things`, that share of its pictures shows the things folder's things (`corpus_things`)."""
    from ..data.synthetic import things as things_lib
    from ..data.synthetic.corpus import CORPUS_SET
    from ..data.synthetic.corpus_things import with_things
    from ..data.synthetic.generator import generate
    from ..tokenizer import Tokenizer

    drawn = None if things is None else dict(digest=things_lib.load(str(things)).digest, share=things_share)
    info, tok_path = folder / "corpus_info.json", folder / "tokenizer.json"
    if info.is_file() and tok_path.is_file():
        have = json.loads(info.read_text())
        if (have.get("seed"), have.get("n_train"), have.get("n_val"), have.get("things")) == (
                seed, images, val_images, drawn):
            return tok_path
        raise ConfigError(f"{folder} holds a corpus of seed {have.get('seed')} with {have.get('n_train')} + "
                          f"{have.get('n_val')} pictures and things {have.get('things')}, not seed {seed} with "
                          f"{images} + {val_images} and things {drawn}: choose another --out")
    info.unlink(missing_ok=True)  # written last by the build: its absence marks an unfinished one
    spec = CORPUS_SET if things is None else with_things(things, things_share)
    generate(spec, folder, images, val_images, size=64, seed=seed, progress=progress, workers=workers)
    if drawn is not None:  # the info file records which things folder the corpus drew from
        info.write_text(json.dumps(dict(json.loads(info.read_text()), things=drawn)))
    texts = [c["caption"] for c in json.loads((folder / "captions_train.json").read_text())["annotations"]]
    questions = json.loads((folder / "v2_OpenEnded_mscoco_train_questions.json").read_text())["questions"]
    texts += [q["question"] for q in questions]
    texts += sorted({a["multiple_choice_answer"] for a in
                     json.loads((folder / "v2_mscoco_train_annotations.json").read_text())["annotations"]})
    Tokenizer.train(texts, alphabet=ALPHABET).save(tok_path)
    return tok_path


def run(args: argparse.Namespace) -> int:
    from ..config import TrainConfig
    from .cli import train
    from .runfolder import resolve

    check_out_folder("--out", args.out)
    if args.images < 1 or args.val_images < 1:
        raise ConfigError(f"--images and --val-images must be >= 1, got {args.images} and {args.val_images}")
    if args.grounding_weight < 0:
        raise ConfigError(f"--grounding-weight must be >= 0, got {args.grounding_weight}")
    if not 0 < args.things_share <= 1:
        raise ConfigError(f"--things-share must be in (0, 1], got {args.things_share}")
    if args.minutes is not None and not args.minutes > 0:
        raise ConfigError(f"--minutes must be more than 0, got {args.minutes}")
    out = Path(args.out)
    t0 = time.perf_counter()
    tokenizer_path = build_corpus(out / "corpus", args.images, args.val_images, args.seed, args.workers,
                                  things=args.things, things_share=args.things_share)
    corpus_s = time.perf_counter() - t0
    length = (dict(time_limit=f"{args.minutes}m") if args.minutes is not None
              else dict(max_steps=args.max_steps or DEFAULT_STEPS))
    flags = dict(PRETRAIN_FLAGS, data=str(out / "corpus"), out=str(out), seed=args.seed, schedule=args.schedule,
                 grounding_weight=args.grounding_weight,
                 tokenizer=str(tokenizer_path), resume=(out / "last").exists() or (out / "last.old").exists(), **length)
    cfg: TrainConfig = resolve(flags)
    trainer = train(cfg)
    card = dict(command="vqa pretrain " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["pretrain"] else None,
                corpus=dict(images=args.images, val_images=args.val_images, seed=args.seed, folder="corpus",
                            things=None if args.things is None else dict(
                                folder=str(args.things), share=args.things_share, digest=json.loads(
                                    (out / "corpus" / "corpus_info.json").read_text())["things"]["digest"])),
                steps=trainer.step, seed=args.seed, schedule=args.schedule, corpus_seconds=round(corpus_s, 1),
                total_seconds=round(time.perf_counter() - t0, 1), train_flags=flags)
    (out / "pretrain.json").write_text(json.dumps(card, indent=1) + "\n")
    print(f"vqa pretrain: {trainer.step} steps in {card['total_seconds'] / 60:.1f} min; fine-tune with "
          f"vqa train --init-from {out} --data DATA --out RUN")
    return 0


__all__ = ["add_arguments", "build_corpus", "run"]
