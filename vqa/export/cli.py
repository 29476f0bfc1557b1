"""`vqa export`, `vqa import` and `vqa push`: their flags (light: no torch, so `--help` and a usage error answer at
once) and `run`, which loads the module that does the work."""

from __future__ import annotations

import argparse
import importlib


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "push":
        add_push_arguments(p)
        return
    if name == "import":
        p.add_argument("--transformers", required=True, metavar="DIR",
                       help="a VisionEncoderDecoderModel folder (ViT encoder, GPT-2 decoder), "
                            "as save_pretrained writes")
        p.add_argument("--out", required=True, metavar="RUN", help="the checkpoint folder to write (new or empty)")
        return
    p.add_argument("--checkpoint", required=True, metavar="RUN", help="a run or checkpoint folder")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--onnx", metavar="OUT_DIR", help="the folder to write the ONNX graphs into (needs the onnx extra)")
    to.add_argument("--transformers", metavar="OUT_DIR", help="the folder to write a transformers "
                    "VisionEncoderDecoderModel into (ViTModel + GPT-2; needs the transformers extra)")
    p.add_argument("--force", action="store_true",
                   help="replace OUT_DIR if it holds an earlier export (never any other folder)")


def add_push_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run folder (its best/, else last/) or a checkpoint folder")
    p.add_argument("--repo-id", required=True, metavar="USER/NAME", help="the Hugging Face Hub repository")
    p.add_argument("--private", action="store_true", help="create the repository private (an existing one keeps "
                   "its visibility)")
    p.add_argument("--revision", default=None, metavar="BRANCH", help="push to this branch (created from main if new)")
    p.add_argument("--license", default="mit", help="the license in the model card (default mit, the code's; name "
                   "the one your data allows)")
    p.add_argument("--message", default=None, help="the commit message (default: vqa push: RUN)")
    p.add_argument("--out", default=None, metavar="DIR", help="write the files and README.md into DIR (new or "
                   "empty) instead of uploading them")


def run(args: argparse.Namespace) -> int:
    """The module that does the work: push, hf_import, hf_export (--transformers) or onnx."""
    name = {"push": "push", "import": "hf_import"}.get(args.command)
    name = name or ("hf_export" if args.transformers else "onnx")
    return importlib.import_module(f"{__package__}.{name}").run(args)
