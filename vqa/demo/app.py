"""The demo assembled: `build_app(pred) -> gr.Blocks`. It makes what the page needs from the `vqa.Predictor`
(the batching layer, the familiarity reference, the handlers), then builds the tabs' components
(`vqa.demo.ask_tab`, `vqa.demo.explorer`) and wires each tab to its handlers (`wire_ask_tab`,
`wire_explorer_tab`). Without a model, the page that says how to train one (`how_to_train_page`).

The endpoints `/ask`, `/caption`, `/point`, `/heatmap`, `/explain` and `/export` keep their names for
`gradio_client`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from . import ask_tab
from .ask_tab import AskTab, shown_for
from .card import card_markdown, start_reference
from .explorer import Explorer, ExplorerTab
from .explorer import build_tab as build_explorer_tab
from .handlers import Finder, Handlers
from .options import BATCH_WAIT_MS, MAX_BATCH

# a user's last answer and its explorer handle go this long after they were last set (gradio keeps them
# otherwise for as long as the server runs, and a closed tab's for an hour)
STATE_TTL = 1800
# users gradio keeps at all (its default: 10,000), the oldest dropped first; each holds a little of ours
# (the answer, its maps, the display copy as JPEG), the explanations are shared (vqa.demo.explorer)
USERS_KEPT = 1000

HOW_TO_TRAIN = """
# vqa demo: no trained model yet

The demo needs a checkpoint and none was found at `runs/tiny` (in the folder the demo was started from). Train
the tiny model on the built-in Shapes set (about 10 minutes on a laptop CPU), then start the demo again:

```bash
vqa data shapes --out data/shapes
vqa train --data data/shapes --out runs/tiny --preset tiny --time-limit 10m
vqa demo --checkpoint runs/tiny
```

Any run folder (or a checkpoint folder inside one) works with `--checkpoint`.
"""


def how_to_train_page() -> gr.Blocks:
    """The page served without a model: how to train one."""
    with gr.Blocks(title="vqa demo: no model") as page:
        gr.Markdown(HOW_TO_TRAIN, elem_id="how-to-train")
    return page


def build_app(pred=None, max_batch: int = MAX_BATCH, batch_wait_ms: float = BATCH_WAIT_MS,
              reference: Any = "auto") -> gr.Blocks:
    """The demo around a `vqa.Predictor`; with None, a page that explains how to train a model.
    `max_batch` / `batch_wait_ms`: the batching layer's settings; `reference`: the familiarity check ("auto":
    from the training data named in the card, if it is on this machine; None: off; or a `Familiarity`).
    `demo.batching` is the batching layer behind /ask and /caption."""
    if pred is None:
        return how_to_train_page()

    from ..inference.serving import SharedPredictor

    server = SharedPredictor(pred, max_batch=max_batch, max_wait=batch_wait_ms / 1000, attention=True)
    reference_note = start_reference(server, pred, reference)
    handlers, explorer = Handlers(pred, server), Explorer(pred)

    with gr.Blocks(title="vqa demo", delete_cache=(3600, 3600)) as demo:
        state = gr.State(None, time_to_live=STATE_TTL)
        explained = gr.State(None, time_to_live=STATE_TTL)
        gr.Markdown("# vqa: ask about a picture\nUpload a picture (or pick an example), then ask a question, "
                    "caption it or find an object in it. The heatmap shows where the model looked while it wrote "
                    "each word; the attention explorer shows every step.")
        with gr.Tabs(elem_id="main-tabs"):
            ask = ask_tab.build_tab(pred.cfg, pred.tasks, card_markdown(pred, reference_note))
            explore = build_explorer_tab(pred.cfg, pred.grid)
        wire_ask_tab(ask, handlers, state)
        wire_explorer_tab(explore, explorer, state, explained)
    demo.batching = server  # for tests and the curious: the batching layer behind /ask and /caption
    return demo


def wire_ask_tab(t: AskTab, handlers: Handlers, state: gr.State) -> None:
    """The "Ask and caption" tab's events: /ask, /caption, /point (the Find tab) and /heatmap, the heatmap drawn
    after each answer, and the decoding controls shown for the method chosen."""
    # the answer is shown as soon as it is there; its heatmap is drawn by a second, lighter event (and
    # through the API only when /heatmap is asked for)
    heat_args = dict(fn=handlers.heatmap, inputs=[t.word, t.layer, t.head, state], outputs=t.heat,
                     concurrency_id="heatmap", concurrency_limit=4, show_progress="hidden")
    gr.on([t.word.input, t.layer.input, t.head.input], **heat_args, api_name="heatmap")
    # a failed request clears the heatmap: it would show the previous picture's beside the error
    # the answer and the caption fill in as they are decoded (`Handlers.streamed_ask`); Stop cancels them
    asked = gr.on([t.ask_btn.click, t.question.submit], handlers.streamed_ask, [t.image, t.question, t.top_k, state],
                  [t.answer, t.scores, t.word, t.note, state], api_name="ask", concurrency_id="model")
    asked.success(**heat_args, api_name="heatmap_after_ask", api_visibility="private")
    asked.failure(lambda: None, None, t.heat, api_visibility="private", queue=False)
    t.method.change(lambda m: [gr.update(visible=v) for v in shown_for(m)], t.method, t.settings,
                    api_visibility="private", queue=False)
    captioned = t.cap_btn.click(handlers.streamed_caption, [t.image, t.method, *t.settings, state],
                                [t.cap_text, t.cap_details, t.word, state], api_name="caption",
                                concurrency_id="model")
    captioned.success(**heat_args, api_name="heatmap_after_caption", api_visibility="private")
    captioned.failure(lambda: None, None, t.heat, api_visibility="private", queue=False)
    gr.on([t.ask_stop.click, t.cap_stop.click], None, None, None, cancels=[asked, captioned],
          api_visibility="private", queue=False)
    finder = Finder(handlers.pred, handlers.budget)  # the Find tab: Predictor.point, drawn on the picture
    gr.on([t.find_btn.click, t.find_object.submit], finder.find, [t.image, t.find_object],
          [t.found_picture, t.found_line], api_name="point", concurrency_id="model")


def wire_explorer_tab(t: ExplorerTab, explorer: Explorer, state: gr.State, explained: gr.State) -> None:
    """The attention explorer tab's events: /explain (the button, or opening the tab) and /export, and the
    redraws."""
    views = [t.self_img, t.cross_img, t.qk_img, t.vit_img]
    selectors = [t.token, t.layer, t.head]
    gr.on([t.explain_btn.click, t.tab.select], explorer.explain, [state],
          [explained, *selectors, t.row, t.col, t.info, *views, t.cross], api_name="explain",
          concurrency_id="explain", concurrency_limit=2)
    gr.on([t.layer.input, t.head.input, t.cross.input], explorer.redraw_self, [explained, *selectors, t.cross],
          [t.self_img, t.qk_img], concurrency_id="explain", api_visibility="undocumented")
    t.token.input(explorer.redraw_token, [explained, *selectors, t.cross],
                  [t.cross_img, t.qk_img, t.vit_img, t.row, t.col], concurrency_id="explain",
                  api_visibility="undocumented")
    gr.on([t.row.release, t.col.release], explorer.redraw_patch, [explained, t.row, t.col], t.vit_img,
          concurrency_id="explain", api_visibility="undocumented")
    t.export_btn.click(explorer.export, [explained, *selectors, t.row, t.col, t.cross], t.files, api_name="export",
                       concurrency_id="explain")


__all__ = ["build_app", "how_to_train_page", "HOW_TO_TRAIN", "STATE_TTL", "USERS_KEPT"]
