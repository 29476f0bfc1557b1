"""The collection side of `vqa caption` / `vqa ask` (`vqa.inference.cli` keeps the one-image side): its options,
which form a command line takes, and the run (`vqa.inference.collection.job`).

Exit status: 0 when every input was answered, 1 when some failed (their records say why) or a file is missing or
bad (an INPUT that names nothing, a malformed questions file), 2 for a usage error (a missing INPUT or QUESTION,
options that cannot work together, an output another process is writing)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ...config import DECODING_METHODS, GenerationConfig, ranking_methods
from ...data.readers.shards import SHARD_EXTS
from ...data.sources import is_pattern
from ...errors import ConfigError, InputError
from ...logs import get_logger
from ...options import check_out_folder, given
from .inputs import LIST_EXTS

log = get_logger("inference")

ASK_RENAME = {"top_k": "--sample-top-k"}  # `vqa ask --top-k` is the number of answers


def add_collection_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("collections (many INPUTs, a folder, --out or --questions)")
    g.add_argument("--out", metavar="FILE.jsonl", default=None,
                   help="write one JSON record per input here, as they finish; a rerun skips what is written "
                        "(default: standard output)")
    g.add_argument("--batch-size", type=int, default=32, metavar="N", help="images per model call (default 32)")
    g.add_argument("--workers", type=int, default=2, metavar="N",
                   help="DataLoader processes decoding images while the model runs (default 2; 0: none)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="decode through the compiled step (default for many INPUTs: on CUDA and with --int8, as the "
                        "Predictor; for one image: off, as compiling costs more than one answer saves)")
    g.add_argument("--merge", metavar="FILE.jsonl", default=None,
                   help="merge the part files of a multi-process run of FILE.jsonl into it, and do nothing else")


def _one_file(raw: str) -> bool:
    """An INPUT that is one image (or a path that names nothing: today's error for it)."""
    glob_chars = any(c in raw for c in "*?[")
    suffix = Path(raw).suffix.lower()
    return not (Path(raw).is_dir() or glob_chars or is_pattern(raw) or suffix in LIST_EXTS or suffix in SHARD_EXTS)


def check_options(args) -> None:
    """The options' values, before any work: ConfigError (a usage error) naming the first one that cannot work."""
    if args.merge and (args.inputs or getattr(args, "questions", None)):
        raise ConfigError("--merge merges the part files and does nothing else: give no INPUT or --questions with it")
    single_image(args)  # a missing INPUT or QUESTION
    if args.int8 and args.precision != "auto":
        raise ConfigError(f"--int8 and --precision {args.precision} do not go together: choose one")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.workers < 0:
        raise ConfigError(f"--workers must be at least 0, got {args.workers}")
    if args.attention_out:
        check_out_folder("--attention-out", args.attention_out)
    if args.out and Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} is a folder, not a file")
    if args.command == "ask" and len(args.inputs) == 2 and single_image(args) and not args.inputs[1].strip():
        raise ConfigError("the question is empty")
    changes = given(args, GenerationConfig, ASK_RENAME if args.command == "ask" else None)
    method = GenerationConfig().replace(**changes).method
    top_k = getattr(args, "top_k", 1)
    if top_k < 1:
        raise ConfigError(f"--top-k must be at least 1, got {top_k}")
    if changes.get("num_beams", top_k) < top_k:
        raise ConfigError(f"--num-beams {changes['num_beams']} cannot return --top-k {top_k} answers: give "
                          f"--num-beams {top_k} or more")
    if args.command == "ask" and top_k > 1 and "method" in changes and not DECODING_METHODS[method].ranked:
        ranking = ranking_methods()
        raise ConfigError(f"--top-k {top_k} lists the {top_k} likeliest answers, which only {' or '.join(ranking)} "
                          f"search finds: {method} decoding gives one answer (use --method {ranking[0]}, "
                          "or --top-k 1)")


def single_image(args) -> bool:
    """Today's form: one image (and one question), no --out: the answer printed as text or JSON."""
    if args.merge:
        return False
    if getattr(args, "questions", None):
        if args.inputs:
            raise ConfigError("give either --questions Q.jsonl or INPUT... QUESTION, not both")
        return False
    if args.command == "ask":
        if len(args.inputs) < 2:
            raise ConfigError("vqa ask needs INPUT... QUESTION (the question last, quoted) or --questions Q.jsonl")
        return len(args.inputs) == 2 and args.out is None and _one_file(args.inputs[0])
    if not args.inputs:
        raise ConfigError("vqa caption needs an INPUT: an image, a folder, a glob, a list of paths or shards")
    return len(args.inputs) == 1 and args.out is None and _one_file(args.inputs[0])


def _merge(args) -> int:
    from ...locks import RunLock
    from .output import merge, part_files

    out = Path(args.merge)
    if not part_files(out):
        raise InputError(f"{out}: no part files to merge ({out.name}.part-00000, ...)")
    with RunLock.for_file(out):
        total, errors = merge(out)
    log.info(f"vqa {args.command}: merged {total} records into {out}" + (f"; {errors} failed" if errors else ""))
    return 1 if errors else 0


def _run(args, load, collection, output, dist, top_k: int):
    from ...distributed import agree
    from .job import Job
    from .output import JobSettings

    kind = "point" if getattr(args, "point", False) else args.command
    failure = None
    try:  # every rank learns whether any failed here, so none waits for a rank that has left
        pred = load(args, compile=args.compile, device=dist.device)
        # the settings, checked before any work (a model not trained for the task stops here)
        if args.command == "ask":
            settings = pred.answer_settings(top_k, changes=given(args, GenerationConfig, ASK_RENAME))
        else:
            settings = pred.caption_settings(changes=given(args, GenerationConfig))
        stamp = JobSettings.of(pred, kind, settings, top_k)  # points and answers: never resumed one as the other
        stamp.check(output.out, output.settings_found)  # another model or other options: refused before decoding
    except Exception as e:  # noqa: BLE001 -- told to the other ranks, then raised again
        failure = e
    agree(dist, failure)
    if dist.main:
        log.info(f"vqa {args.command}: {collection.describe()} ({len(collection)} inputs) on {pred.device}"
                 f"{' x ' + str(dist.world) + ' processes' if dist.world > 1 else ''}, "
                 f"batches of {args.batch_size}")
    job = Job(pred, collection, output, kind, settings, top_k=top_k,
              batch=args.batch_size, workers=args.workers, dist=dist, stamp=stamp.digest)
    return job.run()


def run_collection(args, load) -> int:
    """The job over args.inputs (or --questions); `load(args, compile=, device=)` gives the Predictor."""
    from ...distributed import cleanup, setup
    from .inputs import expand, read_questions

    if args.merge:
        return _merge(args)
    if args.attention_out:
        raise ConfigError("--attention-out explains one image: give one image and no --out")
    top_k = getattr(args, "top_k", 1)
    if args.command == "ask":
        if args.questions:
            collection = read_questions(args.questions)
        else:
            question = " ".join(args.inputs[-1].split())
            if not question:
                raise ConfigError("the question (the last argument) is empty")
            collection = expand(args.inputs[:-1], question)
    else:
        collection = expand(args.inputs)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and args.out is None:
        raise ConfigError("under torchrun every process writes a part of --out: give --out FILE.jsonl")
    dist = setup(args.device or "auto")
    try:
        return _collect(args, load, collection, dist, top_k)
    finally:  # the process group ends before the interpreter does: gloo aborts a rank whose group outlives it
        cleanup()


def _collect(args, load, collection, dist, top_k: int) -> int:
    from .job import open_output
    from .output import Output

    repeats = collection.describe_repeats()
    if repeats and dist.main:  # one record per (image, question): resuming depends on it, but never silently
        where = f"{args.questions}: " if getattr(args, "questions", None) else ""
        log.warning(f"vqa {args.command}: {where}{repeats}")
    output = Output(args.out, dist.rank, dist.world)
    open_output(output, dist)  # a second writer, or a malformed output, stops here: before the model loads
    try:
        s = _run(args, load, collection, output, dist, top_k)
    finally:
        output.release()
    if dist.main:
        rate = s.written / s.seconds if s.seconds > 0 else 0.0
        msg = f"vqa {args.command}: {s.written} records written in {s.seconds:.1f} s ({rate:.1f} images/s)"
        if s.skipped:
            msg += f", {s.skipped} already in {args.out}"
        msg += f"; {s.errors} of {s.total} failed (their records say why)" if s.errors else f"; all {s.total} answered"
        log.info(msg + (f"; output: {args.out}" if args.out else ""))
    return 1 if s.errors else 0


__all__ = ["add_collection_arguments", "check_options", "single_image", "run_collection"]
