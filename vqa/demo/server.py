"""Serving the demo: `run(args)` (`vqa demo`; `main(argv)` for `python app.py` and `python -m vqa.demo`:
loading the Predictor, the start-up messages; the flags are vqa.demo.options'), `load_predictor`, `queue_sizes` (how
many requests are worked on at once and how many may wait) and `serve(demo, host, port, ...)`, which queues and launches
a `build_app` page: uploads capped at MAX_FILE_SIZE (their decoded pictures within vqa.demo.uploads' budget,
their memory handed back when freed), only the example folders readable, 127.0.0.1 unless told otherwise, and
gradio's start-up check of its own address tried again on a busy machine.
"""

from __future__ import annotations

import argparse
import warnings

import gradio as gr

from ..data.images import MAX_PIXELS
from ..errors import VQAError
from ..inference.warmup import BackgroundWarmUp, warm_up
from ..logs import get_logger
from .app import USERS_KEPT, build_app
from .ask_tab import MAX_TOP_K, SAMPLES, SHAPES
from .options import DEFAULT_HOST, DEFAULT_RUN, MAX_BATCH, add_arguments, check, queue_sizes
from .uploads import give_back_decoded_memory

log = get_logger("demo")

MAX_FILE_SIZE = "10mb"
LAUNCH_ATTEMPTS = 3  # launches tried when gradio's start-up check of its own address (5 tries of 3 s) fails
ENCODING_CACHE = 64  # picture encodings kept (by content)

THEME_FONTS = ["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"]
CSS = """
#answer textarea { font-size: 1.4em; font-weight: 600; }
#caption-text textarea { font-size: 1.2em; }
"""


def serve(demo: gr.Blocks, host: str = DEFAULT_HOST, port: int | None = None, concurrency: int | None = None,
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
                              footer_links=["api", "gradio"], allowed_paths=[str(SAMPLES), str(SHAPES.resolve())],
                              ssr_mode=False, max_threads=threads,
                              state_session_capacity=USERS_KEPT)
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


def load_predictor(checkpoint: str | None, device: str | None = None, int8: bool = False, compile: bool | None = None,
                   revision: str | None = None):
    """The Predictor of `checkpoint`; None when no checkpoint was named and runs/tiny holds none. `int8`: dynamic
    int8 linear layers (CPU; a warning and float32 where int8 cannot run); `compile`: the compiled decode step
    (default: the Predictor's, on CUDA and for int8)."""
    from ..errors import CheckpointError
    from ..inference.predict import Predictor
    from ..weights.checkpoint import resolve

    if checkpoint is None:
        try:
            resolve(DEFAULT_RUN)
        except CheckpointError:
            return None
        checkpoint = str(DEFAULT_RUN)
    return Predictor.from_pretrained(checkpoint, device=device, revision=revision, max_pixels=MAX_PIXELS,
                                     cache_size=ENCODING_CACHE,
                                     quantize="int8" if int8 else None, compile=compile)


def start_warm_up(pred, max_batch: int, prog: str = "app.py") -> BackgroundWarmUp | None:
    """Compile every batch shape of a compiling Predictor so that no request waits for the compiler. On CUDA
    now, before the demo listens (a CUDA graph is not captured while other threads launch kernels); elsewhere
    in the background, the demo answering eagerly meanwhile (a CPU takes minutes). Reports on stderr."""
    if pred is None or not pred.compile:
        return None
    if pred.device.type == "cuda":
        log.info(f"{prog}: compiling the model for batches of up to {max_batch}...")
        w = warm_up(pred, max_batch, max_beams=MAX_TOP_K)
        log.info(f"{prog}: compiled {w.shapes} batch shapes in {w.seconds:.0f} s")
        return None

    def report(job: BackgroundWarmUp) -> None:
        if job.result is not None:
            log.info(f"{prog}: compiled {job.result.shapes} batch shapes in {job.result.seconds:.0f} s; answering "
                     "through the compiled model from now on")
        else:
            log.warning(f"{prog}: compiling failed ({job.error}); answering eagerly")

    log.info(f"{prog}: compiling the model for batches of up to {max_batch} in the background (minutes on a CPU); "
             "answering eagerly until then")
    return BackgroundWarmUp(pred, max_batch, max_beams=MAX_TOP_K, on_done=report)


def parser(prog: str = "app.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve the vqa demo (Gradio).")
    add_arguments(p)
    return p


def main(argv: list[str] | None = None, prog: str = "app.py") -> int:
    """`python app.py` / `python -m vqa.demo`: parse `argv` (a usage error exits with status 2), then `run`."""
    p = parser(prog)
    args = p.parse_args(argv)
    problem = check(args)
    if problem:
        p.error(problem)
    return run(args, prog)


def run(args: argparse.Namespace, prog: str = "vqa demo") -> int:
    """Serve the demo until interrupted (`args` checked by vqa.demo.options.check); 1 when the checkpoint
    cannot be loaded or the port is taken."""
    concurrency, queue_size = queue_sizes(args.max_batch, args.concurrency, args.queue_size)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            pred = load_predictor(args.checkpoint, args.device, int8=args.int8, compile=args.compile,
                                  revision=args.revision)
        for w in caught:  # int8 that cannot run here: say so once, on the console
            log.warning(f"{prog}: {w.message}")
    except VQAError as e:
        log.error(f"{prog}: error: {e}")
        return 1
    if pred is None:
        log.warning(f"{prog}: no checkpoint at {DEFAULT_RUN}; serving a page that explains how to train one "
                    "(vqa data shapes, then vqa train)")
    start_warm_up(pred, args.max_batch, prog)  # before listening on CUDA, else in the background
    demo = build_app(pred, max_batch=args.max_batch, batch_wait_ms=args.batch_wait)
    try:
        _, url, _ = serve(demo, args.host, args.port, concurrency, queue_size, block=False, quiet=True)
    except OSError as e:
        log.error(f"{prog}: error: cannot listen on {args.host}:{args.port or 7860}: {e}")
        return 1
    what = f"model {pred.path} on {pred.device} ({pred.precision})" if pred else "no model (how-to page)"
    print(f"vqa demo: serving {what} at {url} (batches of up to {args.max_batch}, {concurrency} at once, "
          f"{queue_size} waiting; Ctrl+C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0
