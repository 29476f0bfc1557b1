"""The demo's command line (`vqa demo`, `python -m vqa.demo`, `python app.py`): its flags, their defaults and
their checks. Light (no gradio, no torch), so `vqa demo --help` and a bad flag answer at once."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_RUN = Path("runs") / "tiny"
DEFAULT_HOST = "127.0.0.1"
MAX_BATCH = 16  # questions answered by one model call, at most
BATCH_WAIT_MS = 2  # how long the first request of a batch waits for company (a lone request: that much later)


def queue_sizes(max_batch: int = MAX_BATCH, concurrency: int | None = None,
                queue_size: int | None = None) -> tuple[int, int]:
    """(concurrency, queue size): by default 2 x max_batch requests worked on at once (one batch runs while
    the next gathers) and 2 x that many waiting."""
    concurrency = 2 * max_batch if concurrency is None else concurrency
    queue_size = 2 * concurrency if queue_size is None else queue_size
    if concurrency < 1 or queue_size < 1:  # gradio queues every request first, even when a worker is free
        raise ValueError(f"concurrency and queue size must be at least 1, got {concurrency} and {queue_size}")
    return concurrency, queue_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, metavar="RUN",
                   help=f"a run or checkpoint folder (default: {DEFAULT_RUN} if it holds one), or a Hugging Face "
                        "Hub name (user/name)")
    p.add_argument("--revision", default=None, metavar="REV",
                   help="with a Hugging Face Hub name: the branch, tag or commit to load (as user/name@REV)")
    p.add_argument("--host", default=None,
                   help=f"address to listen on (default: $GRADIO_SERVER_NAME, else {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=None,
                   help="port (default: $GRADIO_SERVER_PORT, else 7860 or the next free one)")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: CUDA, else MPS, else CPU)")
    p.add_argument("--int8", action="store_true",
                   help="dynamic int8 linear layers on a CPU (4x smaller weights; compiled, faster; "
                        "needs the int8 extra: pip install 'vqa[int8]')")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="decode through the torch.compile'd step (default: on CUDA, and with --int8); every batch "
                        "shape is compiled at start-up: on CUDA before the demo takes requests, on a CPU in the "
                        "background while it answers eagerly")
    p.add_argument("--max-batch", type=int, default=MAX_BATCH,
                   help=f"questions answered by one batched model call, at most (default {MAX_BATCH})")
    p.add_argument("--batch-wait", type=float, default=BATCH_WAIT_MS, metavar="MS",
                   help=f"how long a batch waits for more questions, in ms (default {BATCH_WAIT_MS})")
    p.add_argument("--concurrency", type=int, default=None,
                   help="requests worked on at once (default 2 x --max-batch)")
    p.add_argument("--queue-size", type=int, default=None,
                   help="requests that may wait beyond those (default 2 x --concurrency); more are told the "
                        "demo is busy")


def check(args: argparse.Namespace) -> str | None:
    """Fill --host / --port from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT when not given; the usage error of
    bad values (one line), else None."""
    if args.host is None:
        args.host = os.environ.get("GRADIO_SERVER_NAME", "").strip() or DEFAULT_HOST
    if args.port is None:
        value = os.environ.get("GRADIO_SERVER_PORT", "").strip()
        if value and not value.isdigit():
            return f"GRADIO_SERVER_PORT must be a port number, got {os.environ['GRADIO_SERVER_PORT']!r}"
        args.port = int(value) if value else None
    if args.max_batch < 1 or args.batch_wait < 0:
        return "--max-batch must be at least 1 and --batch-wait at least 0"
    if args.port is not None and not 1 <= args.port <= 65535:
        return f"--port must be from 1 to 65535, got {args.port}"
    try:
        queue_sizes(args.max_batch, args.concurrency, args.queue_size)
    except ValueError as e:
        return str(e)
    return None
