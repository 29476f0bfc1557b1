"""`python -m vqa.demo [--checkpoint RUN] ...`: the same as `python app.py` (vqa.demo.server.main)."""

import sys

from .server import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m vqa.demo"))
