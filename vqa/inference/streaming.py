"""`Predictor.stream`: an answer or caption as it is decoded.

    for text in p.stream("photo.jpg", "what is on the table?"):   # or p.stream("photo.jpg") for a caption
        print(text)                                                  # the text so far, each time it changes

The decoding runs in a thread of its own (`run_streamed`) through the same `answer_batch` / `caption_batch` as
`answer` / `caption`, with `generate(watch=)` reporting each step's tokens; the last text yielded is the
result's own, and the result (Answer / Caption) is the generator's return value. Beam search shows its best
hypothesis so far, which a later step may replace. Closing the generator stops the decoding at its next step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any

from .results import Answer, Caption


class _Stopped(Exception):
    """Raised inside the decoding when the reader has gone."""


def run_streamed(call: Callable, decode: Callable[[list[int]], str], show: Callable = lambda text: text,
                 stop_early: bool = True) -> Generator[Any, None, tuple[Any, str | None]]:
    """Run `call(hook)` in a thread of its own, `hook(ids)` called with the tokens so far at every step; yield
    `show(text)` whenever the decoded text changes (a slow reader gets the latest only) and return (`call`'s
    result, the last text shown), or raise its error. `stop_early`: a reader that leaves stops the decoding at
    its next step (a shared batch, whose other rows go on, passes False)."""
    events: queue.Queue = queue.Queue()
    stop = threading.Event()

    def hook(ids: list[int]) -> None:
        if stop_early and stop.is_set():
            raise _Stopped  # nobody reads the error it becomes
        events.put(("text", list(ids)))

    def work() -> None:
        try:
            events.put(("done", call(hook)))
        except BaseException as e:  # the caller's error, raised where it reads
            events.put(("error", e))

    threading.Thread(target=work, name="vqa-stream", daemon=True).start()
    shown = None
    try:
        while True:
            kind, value = events.get()
            while kind == "text" and not events.empty():
                kind, value = events.get_nowait()
            if kind == "error":
                raise value
            if kind == "done":
                return value, shown
            text = decode(value)
            if text and text != shown:
                shown = text
                yield show(text)
    finally:
        stop.set()


def stream(pred, image: Any, question: str | None = None, top_k: int = 1, generation=None,
           **changes) -> Generator[str, None, Answer | Caption]:
    """`Predictor.stream`'s generator (see the module docstring)."""

    def call(hook):
        watch = lambda rows: hook(rows[0])  # noqa: E731
        if question is None:
            return pred.caption_batch([image], generation, watch=watch, **changes)[0]
        return pred.answer_batch([image], [question], top_k, generation, watch=watch, **changes)[0]

    res, shown = yield from run_streamed(call, pred.tokenizer.decode)
    final = res.answer if isinstance(res, Answer) else res.caption
    if final != shown:
        yield final
    return res


def print_stream(texts: Generator[str, None, Answer | Caption], out) -> Answer | Caption:
    """Write the texts of `stream` to the terminal `out` as they come (a text that extends the one shown adds
    its new end; beam search's revisions rewrite the line), then a newline; returns the result."""
    shown = ""
    while True:
        try:
            text = next(texts)
        except StopIteration as done:
            out.write("\n")
            out.flush()
            return done.value
        out.write(text[len(shown):] if text.startswith(shown) else "\r\x1b[K" + text)
        out.flush()
        shown = text


__all__ = ["stream", "print_stream", "run_streamed"]
