"""Serving the demo: `main(argv)` (the command line of `python app.py` and `python -m vqa.demo`: its flags,
loading the Predictor, the start-up messages), `load_predictor`, `queue_sizes` (how many requests are worked
on at once and how many may wait) and `serve(demo, host, port, ...)`, which queues and launches a
`build_app` page: uploads capped at MAX_FILE_SIZE (their decoded pictures within vqa.demo.uploads' budget,
their memory handed back when freed), only the example folders readable, 127.0.0.1 unless told otherwise, and
gradio's start-up check of its own address tried again on a busy machine.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import gradio as gr

from ..data.images import MAX_PIXELS
from ..errors import VQAError
from ..inference.warmup import BackgroundWarmUp, warm_up
from .examples import SAMPLES, SHAPES
from .layout import BATCH_WAIT_MS, MAX_BATCH, MAX_TOP_K, SESSIONS_KEPT, build_app
from .uploads import give_back_decoded_memory

DEFAULT_RUN = Path("runs") / "tiny"
MAX_FILE_SIZE = "10mb"
LAUNCH_ATTEMPTS = 3  # launches tried when gradio's start-up check of its own address (~17 s) fails
ENCODING_CACHE = 64  # picture encodings kept (by content)

THEME_FONTS = ["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"]
CSS = """
#answer textarea { font-size: 1.4em; font-weight: 600; }
#caption-text textarea { font-size: 1.2em; }
"""


def queue_sizes(max_batch: int = MAX_BATCH, concurrency: int | None = None,
                queue_size: int | None = None) -> tuple[int, int]:
    """(concurrency, queue size): by default 2 x max_batch requests worked on at once (one batch runs while
    the next gathers) and 2 x that many waiting."""
    concurrency = 2 * max_batch if concurrency is None else concurrency
    queue_size = 2 * concurrency if queue_size is None else queue_size
    if concurrency < 1 or queue_size < 1:  # gradio queues every request first, even when a worker is free
        raise ValueError(f"concurrency and queue size must be at least 1, got {concurrency} and {queue_size}")
    return concurrency, queue_size


def serve(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None, concurrency: int | None = None,
          queue_size: int | None = None, block: bool = True, quiet: bool = False, max_batch: int = MAX_BATCH):
    """Queue and launch `demo`; returns gradio's (app, local_url, share_url). With `block`, serves until
    interrupted. `concurrency` / `queue_size` default to `queue_sizes(max_batch)`."""
    concurrency, queue_size = queue_sizes(max_batch, concurrency, queue_size)
    give_back_decoded_memory()  # decoded uploads' memory goes back to the system, not to per-thread arenas
    demo.queue(default_concurrency_limit=concurrency, max_size=queue_size)
    theme = gr.themes.Soft(font=THEME_FONTS, font_mono=["ui-monospace", "monospace"])  # no web fonts: works offline
    # every request being worked on holds a worker thread while it waits for its batch; pre- and
    # post-processing need threads of their own beside them (gradio's default pool has 40)
    threads = max(40, 2 * concurrency + 16)
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        try:
            out = demo.launch(server_name=host, server_port=port, max_file_size=MAX_FILE_SIZE,
                              prevent_thread_lock=True, quiet=quiet, show_error=False, theme=theme, css=CSS,
                              footer_links=["api", "gradio"], allowed_paths=[str(SAMPLES), str(SHAPES)],
                              ssr_mode=False, max_threads=threads, state_session_capacity=SESSIONS_KEPT)
            break
        except ValueError as e:
            # gradio checks its own address (5 tries of 3 s) and, when that fails, says to set share=True:
            # a public tunnel. On an overloaded machine the server is only slow to answer: try again, then
            # say what happened, never suggest sharing the demo
            if "localhost is not accessible" not in str(e):
                raise
            demo.close()
            if attempt == LAUNCH_ATTEMPTS:
                raise RuntimeError(
                    f"the demo started on {host}:{port or 'a free port'} but did not answer its own start-up check "
                    f"{LAUNCH_ATTEMPTS} times (about 17 s each): the machine is busy, or a proxy setting "
                    "(HTTP_PROXY without NO_PROXY=127.0.0.1,localhost) sends local requests elsewhere") from None
    if block:
        demo.block_thread()
    return out


def load_predictor(checkpoint: str | None, device: str | None = None, int8: bool = False, compile: bool | None = None):
    """The Predictor of `checkpoint`; None when no checkpoint was named and runs/tiny holds none. `int8`: dynamic
    int8 linear layers (CPU; a warning and float32 where int8 cannot run); `compile`: the compiled decode step
    (default: the Predictor's, on CUDA and for int8)."""
    from ..errors import CheckpointError
    from ..inference.predict import Predictor
    from ..model.checkpoint import resolve

    if checkpoint is None:
        try:
            resolve(DEFAULT_RUN)
        except CheckpointError:
            return None
        checkpoint = str(DEFAULT_RUN)
    return Predictor.from_pretrained(checkpoint, device=device, max_pixels=MAX_PIXELS, cache_size=ENCODING_CACHE,
                                     quantize="int8" if int8 else None, compile=compile)


def start_warm_up(pred, max_batch: int, prog: str = "app.py") -> BackgroundWarmUp | None:
    """Compile every batch shape of a compiling Predictor so that no request waits for the compiler. On CUDA
    now, before the demo listens (a CUDA graph is not captured while other threads launch kernels); elsewhere
    in the background, the demo answering eagerly meanwhile (a CPU takes minutes). Reports on stderr."""
    if pred is None or not pred.compile:
        return None
    if pred.device.type == "cuda":
        print(f"{prog}: compiling the model for batches of up to {max_batch}...", file=sys.stderr, flush=True)
        w = warm_up(pred, max_batch, max_beams=MAX_TOP_K)
        print(f"{prog}: compiled {w.shapes} batch shapes in {w.seconds:.0f} s", file=sys.stderr, flush=True)
        return None

    def report(job: BackgroundWarmUp) -> None:
        if job.result is not None:
            print(f"{prog}: compiled {job.result.shapes} batch shapes in {job.result.seconds:.0f} s; answering "
                  "through the compiled model from now on", file=sys.stderr, flush=True)
        else:
            print(f"{prog}: compiling failed ({job.error}); answering eagerly", file=sys.stderr, flush=True)

    print(f"{prog}: compiling the model for batches of up to {max_batch} in the background (minutes on a CPU); "
          "answering eagerly until then", file=sys.stderr, flush=True)
    return BackgroundWarmUp(pred, max_batch, max_beams=MAX_TOP_K, on_done=report)


def parser(prog: str = "app.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve the vqa demo (Gradio).")
    p.add_argument("--checkpoint", default=None, metavar="RUN",
                   help=f"a run or checkpoint folder (default: {DEFAULT_RUN} if it holds one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=None, help="port (default 7860, or the next free one)")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: CUDA, else MPS, else CPU)")
    p.add_argument("--int8", action="store_true",
                   help="dynamic int8 linear layers on a CPU (4x smaller weights; compiled, faster): "
                        "docs/performance.md has the speed and the accuracy change")
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
    return p


def main(argv: list[str] | None = None, prog: str = "app.py") -> int:
    """Serve the demo until interrupted; 2 when the checkpoint cannot be loaded or the port is taken."""
    p = parser(prog)
    args = p.parse_args(argv)
    if args.max_batch < 1 or args.batch_wait < 0:
        p.error("--max-batch must be at least 1 and --batch-wait at least 0")
    if args.port is not None and not 1 <= args.port <= 65535:
        p.error(f"--port must be from 1 to 65535, got {args.port}")
    try:
        concurrency, queue_size = queue_sizes(args.max_batch, args.concurrency, args.queue_size)
    except ValueError as e:
        p.error(str(e))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            pred = load_predictor(args.checkpoint, args.device, int8=args.int8, compile=args.compile)
        for w in caught:  # int8 that cannot run here: say so once, on the console
            print(f"{prog}: {w.message}", file=sys.stderr)
    except VQAError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if pred is None:
        print(f"{prog}: no checkpoint at {DEFAULT_RUN}; serving a page that explains how to train one "
              "(`make demo`)", file=sys.stderr)
    start_warm_up(pred, args.max_batch, prog)  # before listening on CUDA, else in the background
    demo = build_app(pred, max_batch=args.max_batch, batch_wait_ms=args.batch_wait)
    try:
        _, url, _ = serve(demo, args.host, args.port, concurrency, queue_size, block=False, quiet=True)
    except OSError as e:
        print(f"{prog}: error: cannot listen on {args.host}:{args.port or 7860}: {e}", file=sys.stderr)
        return 2
    what = f"model {pred.path} on {pred.device} ({pred.precision})" if pred else "no model (how-to page)"
    print(f"vqa demo: serving {what} at {url} (batches of up to {args.max_batch}, {concurrency} at once, "
          f"{queue_size} waiting; Ctrl+C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0
