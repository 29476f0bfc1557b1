"""The Ask and Caption tabs' answers and captions filled in as they are decoded: generator versions of
`Handlers.ask` / `Handlers.caption` (Gradio sends each value a generator yields to the page).

The handler runs as before, through the batching layer, in a thread of its own, with a hook
(`SharedPredictor`'s `on_tokens`) that the batch's decoding calls with this request's tokens at every step
(`generate(watch=)`); the generator yields the text so far whenever it changes (the other outputs skipped),
then the handler's outputs, whose text is the final one: streaming changes no result, and requests still
share batched calls. Greedy decoding and sampling grow a token at a time; beam search shows its best
hypothesis so far. The Stop button, or a user who leaves the page, cancels the event: Gradio stops reading
the generator, the page stops filling in, and the batch the request is part of finishes for the others.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import gradio as gr

from .handlers import Handlers


def _streamed(call: Callable, decode: Callable[[list[int]], str], skipped: int) -> Iterator[tuple]:
    """Run `call(on_tokens)` in a thread; yield (text so far, `skipped` x gr.skip()) as the tokens come, then
    `call`'s own outputs (or raise its error)."""
    events: queue.Queue = queue.Queue()

    def work():
        try:
            events.put(("done", call(lambda ids: events.put(("tokens", list(ids))))))
        except BaseException as e:  # the handler's gr.Error, shown by the page as before
            events.put(("error", e))

    threading.Thread(target=work, name="vqa-demo-stream", daemon=True).start()
    shown = None
    while True:
        kind, value = events.get()
        while kind == "tokens" and not events.empty():  # a slow page gets the latest text only
            kind, value = events.get_nowait()
        if kind == "done":
            yield value
            return
        if kind == "error":
            raise value
        text = decode(value)
        if text and text != shown:
            shown = text
            yield (text, *[gr.skip()] * skipped)


def streaming_ask(handlers: Handlers):
    """/ask as a generator: the answer as it is decoded, then `handlers.ask`'s outputs."""

    def ask(image, question, top_k, state):
        yield from _streamed(lambda hook: handlers.ask(image, question, top_k, state, on_tokens=hook),
                             handlers.pred.tokenizer.decode, 4)

    return ask


def streaming_caption(handlers: Handlers):
    """/caption as a generator: the caption as it is decoded, then `handlers.caption`'s outputs."""

    def caption(image, method, *values):
        yield from _streamed(lambda hook: handlers.caption(image, method, *values, on_tokens=hook),
                             handlers.pred.tokenizer.decode, 3)

    return caption


__all__ = ["streaming_ask", "streaming_caption"]
