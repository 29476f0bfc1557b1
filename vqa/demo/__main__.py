"""`python -m vqa.demo [--checkpoint RUN] ...`: the same as `vqa demo` (vqa.demo.server.main)."""

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m vqa.demo"))
