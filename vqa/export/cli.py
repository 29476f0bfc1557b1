"""`vqa export` and `vqa import`: their flags (light: no torch, so `--help` and a usage error answer at once)
and `run`, which loads the module that does the work."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "import":
        p.add_argument("--transformers", required=True, metavar="DIR",
                       help="a VisionEncoderDecoderModel folder (ViT encoder, GPT-2 decoder), as save_pretrained writes")
        p.add_argument("--out", required=True, metavar="RUN", help="the checkpoint folder to write (new or empty)")
        return
    p.add_argument("--checkpoint", required=True, metavar="RUN", help="a run or checkpoint folder")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--onnx", metavar="OUT_DIR", help="the folder to write the ONNX graphs into (needs the onnx extra)")
    to.add_argument("--transformers", metavar="OUT_DIR", help="the folder to write a transformers "
                    "VisionEncoderDecoderModel into (ViTModel + GPT-2; needs the transformers extra)")
    p.add_argument("--force", action="store_true",
                   help="replace OUT_DIR if it holds an earlier export (never any other folder)")


def run(args: argparse.Namespace) -> int:
    if args.command == "import":
        from .hf_import import run as run_import

        return run_import(args)
    if args.transformers:
        from .hf_export import run as run_transformers

        return run_transformers(args)
    from .onnx import run as run_onnx

    return run_onnx(args)
