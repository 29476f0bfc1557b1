"""The demo assembled: `build_app(pred) -> gr.Blocks`. It makes what the page needs from the `vqa.Predictor`
(the batching layer, the familiarity reference, the handlers), then builds the tabs' components
(`vqa.demo.ask_tab`, `vqa.demo.explorer_tab`) and wires each tab to its handlers (`vqa.demo.events`). Without a
model, the page that says how to train one (`how_to_train_page`).

The endpoints `/ask`, `/caption`, `/point`, `/heatmap`, `/explain` and `/export` keep their names for
`gradio_client`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from . import ask_tab, explorer_tab
from .card import card_markdown, start_reference
from .events import wire_ask_tab, wire_explorer_tab
from .explorer import Explorer
from .handlers import Handlers
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
            explore = explorer_tab.build_tab(pred.cfg, pred.grid)
        wire_ask_tab(ask, handlers, state)
        wire_explorer_tab(explore, explorer, state, explained)
    demo.batching = server  # for tests and the curious: the batching layer behind /ask and /caption
    return demo


__all__ = ["build_app", "how_to_train_page", "HOW_TO_TRAIN", "STATE_TTL", "USERS_KEPT"]
