"""`Predictor.stream`: an answer or caption as it is decoded.

    for text in p.stream("photo.jpg", "what is on the table?"):   # or p.stream("photo.jpg") for a caption
        print(text)                                                  # the text so far, each time it changes

The decoding runs in a thread of its own through the same `answer_batch` / `caption_batch` as `answer` /
`caption`, with `generate(watch=)` reporting each step's tokens; the generator yields the decoded text so
far whenever it changes, and last the result's own text, so the final text always equals the one `answer` /
`caption` return (their Answer / Caption is the generator's return value). Greedy decoding and sampling grow
by one token a step; beam search shows its best hypothesis so far (an ended one, or the top live beam),
which a later step may replace, and for an answer the final text is the answer of the most probable text
(`vqa.inference.results`). Closing the generator (a consumer that stops reading, a page that is left)
stops the decoding at its next step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator
from typing import Any

from .results import Answer, Caption


class _Stopped(Exception):
    """Raised inside the decoding when the reader has gone."""


def stream(pred, image: Any, question: str | None = None, top_k: int = 1, generation=None,
           **changes) -> Generator[str, None, Answer | Caption]:
    """`Predictor.stream`'s generator (see the module docstring)."""
    events: queue.Queue = queue.Queue()
    stop = threading.Event()

    def watch(rows: list[list[int]]) -> None:
        if stop.is_set():
            raise _Stopped
        events.put(("text", rows[0]))

    def work() -> None:
        try:
            if question is None:
                res = pred.caption_batch([image], generation, watch=watch, **changes)[0]
            else:
                res = pred.answer_batch([image], [question], top_k, generation, watch=watch, **changes)[0]
            events.put(("done", res))
        except _Stopped:
            events.put(("stopped", None))
        except BaseException as e:  # the caller's error, raised where it reads
            events.put(("error", e))

    worker = threading.Thread(target=work, name="vqa-stream", daemon=True)
    worker.start()
    shown = None
    try:
        while True:
            kind, value = events.get()
            while kind == "text" and not events.empty():  # a slow reader gets the latest text only
                kind, value = events.get_nowait()
            if kind == "text":
                text = pred.tokenizer.decode(value)
                if text and text != shown:
                    shown = text
                    yield text
            elif kind == "done":
                final = value.answer if isinstance(value, Answer) else value.caption
                if final != shown:
                    yield final
                return value
            elif kind == "error":
                raise value
            else:
                return None
    finally:
        stop.set()  # a reader that leaves early stops the decoding at its next step


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


__all__ = ["stream", "print_stream"]
