"""The `vqa` command. Each subcommand lives in its own module, which exposes
`add_arguments(parser)` and `run(args) -> int`; modules are imported only when their command runs."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import ConfigError, VQAError
from .logs import set_quiet

# command -> (module, one-line help)
COMMANDS = {
    "data": ("vqa.data.cli", "build the built-in synthetic sets, inspect or convert a data folder, or list / clear "
                             "the image cache"),
    "train": ("vqa.train", "train a model on a data folder (one device, or many under torchrun)"),
    "pretrain": ("vqa.train.pretrain", "build the pretraining corpus and pretrain the tiny preset's towers on it"),
    "eval": ("vqa.evaluation.cli", "evaluate a checkpoint with the official VQA accuracy, BLEU-4 and CIDEr-D"),
    "ask": ("vqa.inference.cli", "answer a question about an image, or questions about many (JSON Lines out)"),
    "caption": ("vqa.inference.cli", "caption an image, or folders, lists and shards of them (JSON Lines out)"),
    "import": ("vqa.export.cli", "import a Hugging Face VisionEncoderDecoderModel (ViT + GPT-2) as a checkpoint"),
    "export": ("vqa.export.cli", "export a checkpoint to ONNX (encoder + decoder step) for onnxruntime, or to a "
                                   "transformers VisionEncoderDecoderModel folder"),
    "push": ("vqa.export.cli", "publish a checkpoint with its model card on the Hugging Face Hub (or write them into a "
                               "folder)"),
    "demo": ("vqa.demo.options", "serve the demo page (Gradio): ask, caption and see where the model looked"),
}

# commands whose flags live in a light module apart from the one that runs them (gradio loads only to serve)
RUNNERS = {"demo": "vqa.demo.server"}

# commands whose INPUTs may come after options too (`vqa caption --checkpoint run a.png --batch-size 2 b.png`):
# their own parser reads the command line with `parse_intermixed_args` (which a parser with subcommands cannot)
INTERMIXED = ("ask", "caption")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vqa", description="Visual question answering and captioning.",
                                     epilog="Exit status: 0 done, 1 a failure while running (a missing or bad file, "
                                            "a checkpoint that does not load, a missing extra), 2 a usage error (a bad "
                                            "or missing option, or options that cannot work together), "
                                            "130 interrupted.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    parser.commands = {}  # name -> its parser
    for name, (module, help_) in COMMANDS.items():
        p = parser.commands[name] = sub.add_parser(name, help=help_, description=help_)
        if name == wanted:  # import only the module of the command being run
            mod = importlib.import_module(module)
            takes_name = mod.add_arguments.__code__.co_argcount >= 2
            mod.add_arguments(p, name) if takes_name else mod.add_arguments(p)
            p.set_defaults(_module=module)
            _add_quiet(p)
    return parser


def version() -> str:
    """The installed package's version (its metadata), or "unknown" for a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("vqa")
    except PackageNotFoundError:
        return "unknown"


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line's arguments; for the INTERMIXED commands, positionals and options in any order."""
    parser = build_parser(argv)
    if argv and argv[0] in INTERMIXED:
        args = parser.commands[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    return parser.parse_args(argv)


def _add_quiet(p: argparse.ArgumentParser) -> None:
    """--quiet on a command's parser, or on each of its actions' (`vqa data shapes ... --quiet`)."""
    actions = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    for action in actions:
        for sub in action.choices.values():
            _add_quiet(sub)
    if not actions:
        p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only; no progress bars")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    set_quiet(getattr(args, "quiet", False))
    check = getattr(importlib.import_module(args._module), "check", None)
    problem = check(args) if check else None
    if problem:  # a usage error found before the heavy modules load
        print(f"vqa {args.command}: error: {problem}", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(RUNNERS.get(args.command, args._module))
        return int(mod.run(args) or 0)
    except VQAError as e:
        print(f"vqa {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1  # options that cannot work: a usage error
    except KeyboardInterrupt:
        print(f"vqa {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
