"""The demo's page: `build_app(pred) -> gr.Blocks`, the Gradio layout of the "Ask and caption" tab (the picture
and its examples; the Ask, Caption and Model card tabs; the heatmap and its word / layer / head selectors)
beside the attention explorer tab (`vqa.demo.explorer`), wired to the handlers (`vqa.demo.handlers`). Without a
model, a page that says how to train one (HOW_TO_TRAIN).

The endpoints `/ask`, `/caption`, `/heatmap`, `/explain` and `/export` keep their names for `gradio_client`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..config import DECODING_METHODS, GenerationConfig
from . import explorer as ex
from .card import card_markdown, start_reference
from .examples import examples
from .handlers import MAX_QUESTION_CHARS, MEAN, Handlers, ui_fields
from .options import BATCH_WAIT_MS, MAX_BATCH
from .uploads import picture_input

MAX_TOP_K = GenerationConfig.ui_bounds("num_beams")[1]  # answers listed at most: beams (the top-k slider)
# a user's last answer and its explorer handle go this long after they were last set (gradio keeps them
# otherwise for as long as the server runs, and a closed tab's for an hour)
STATE_TTL = 1800
# users gradio keeps at all (its default: 10,000), the oldest dropped first; each holds ~50 KB of ours
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


def shown_for(method: str) -> list[bool]:
    """Which decoding controls `method` uses: each field's help starts with the method it is for ("beam: ...")."""
    return [f.metadata.get("help", "").startswith(f"{method}:") for f in ui_fields()]


def decoding_controls(method: str = "greedy") -> list:
    """One control per GenerationConfig field with `ui` metadata: a slider over its (min, max, step), or a
    number box; labelled with the field's help, set to the caption defaults, shown when `method` uses it."""
    defaults = GenerationConfig.for_task("caption")
    out = []
    for f, shown in zip(ui_fields(), shown_for(method), strict=True):
        ui, label = f.metadata["ui"], f"{f.name.replace('_', ' ')} — {f.metadata.get('help', '')}"
        value = getattr(defaults, f.name)
        if ui == "number":
            lo, hi = GenerationConfig.ui_bounds(f.name)
            out.append(gr.Number(value=value if value is not None else 0, precision=0, label=label,
                                 minimum=lo, maximum=hi, elem_id=f"gen-{f.name}", visible=shown))
        else:
            lo, hi, step = ui
            out.append(gr.Slider(lo, hi, value=value, step=step, label=label, elem_id=f"gen-{f.name}",
                                 visible=shown))
    return out


def untrained_note(task: str, tasks) -> str:
    """The note a tab shows when the model was not trained for its task (its button is disabled; the endpoint
    refuses with the Predictor's message)."""
    does = "answer questions" if task == "vqa" else "write captions"
    return f"**This model does not {does}**: it was trained for {', '.join(tasks)} only (see the model card)."


def build_app(pred=None, max_batch: int = MAX_BATCH, batch_wait_ms: float = BATCH_WAIT_MS,
              reference: Any = "auto") -> gr.Blocks:
    """The demo around a `vqa.Predictor`; with None, a page that explains how to train a model.
    `max_batch` / `batch_wait_ms`: the batching layer's settings; `reference`: the familiarity check ("auto":
    from the training data named in the card, if it is on this machine; None: off; or a `Familiarity`).
    `demo.batching` is the batching layer behind /ask and /caption."""
    if pred is None:
        with gr.Blocks(title="vqa demo: no model") as demo:
            gr.Markdown(HOW_TO_TRAIN, elem_id="how-to-train")
        return demo

    from ..inference.serving import BatchedPredictor

    cfg = pred.cfg
    server = BatchedPredictor(pred, max_batch=max_batch, max_wait=batch_wait_ms / 1000, attention=True)
    reference_note = start_reference(server, pred, reference)
    handlers, explorer = Handlers(pred, server), ex.Explorer(pred)
    layer_choices = [("mean of all layers", MEAN)] + [(f"layer {i + 1}", i) for i in range(cfg.cross_layers)]
    head_choices = [("mean of all heads", MEAN)] + [(f"head {i + 1}", i) for i in range(cfg.dec_heads)]

    with gr.Blocks(title="vqa demo", delete_cache=(3600, 3600)) as demo:
        state = gr.State(None, time_to_live=STATE_TTL)
        explained = gr.State(None, time_to_live=STATE_TTL)
        gr.Markdown("# vqa: ask about a picture\nUpload a picture (or pick an example), then ask a question or "
                    "caption it. The heatmap shows where the model looked while it wrote each word; the "
                    "attention explorer shows every step.")
        with gr.Tabs(elem_id="main-tabs"):
            with gr.Tab("Ask and caption", id="demo"):
                with gr.Row():
                    with gr.Column(scale=5):
                        image = picture_input(label="Picture", sources=["upload", "clipboard"], height=300,
                                              elem_id="picture")
                        examples_slot = gr.Column()
                    with gr.Column(scale=6):
                        with gr.Tabs():
                            with gr.Tab("Ask", id="ask"):
                                asks = "vqa" in pred.tasks  # a captioner's Ask tab says why it is disabled
                                if not asks:
                                    gr.Markdown(untrained_note("vqa", pred.tasks), elem_id="ask-untrained")
                                question = gr.Textbox(label="Question", placeholder="what color is the circle?",
                                                      max_length=MAX_QUESTION_CHARS, elem_id="question",
                                                      interactive=asks)
                                with gr.Row(equal_height=True):
                                    top_k = gr.Slider(1, MAX_TOP_K, value=3, step=1,
                                                      label="Answers to list (top-k)", scale=3)
                                    ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-button", scale=1,
                                                        interactive=asks)
                                with gr.Row():
                                    answer = gr.Textbox(label="Answer", interactive=False, elem_id="answer",
                                                        scale=2)
                                    scores = gr.Label(label="Top answers (probability of each exact answer)",
                                                      show_heading=False, elem_id="top-answers", scale=3)
                                note = gr.Markdown(elem_id="note")
                            with gr.Tab("Caption", id="caption"):
                                captions = "caption" in pred.tasks
                                if not captions:
                                    gr.Markdown(untrained_note("caption", pred.tasks), elem_id="caption-untrained")
                                method = gr.Dropdown(list(DECODING_METHODS), value="greedy",
                                                     label="Decoding method", elem_id="method")
                                with gr.Row():
                                    settings = decoding_controls()
                                cap_btn = gr.Button("Caption", variant="primary", elem_id="caption-button",
                                                    interactive=captions)
                                cap_text = gr.Textbox(label="Caption", interactive=False, elem_id="caption-text")
                                cap_details = gr.Markdown(elem_id="caption-details")
                            with gr.Tab("Model card", id="card"):
                                gr.Markdown(card_markdown(pred, reference_note), elem_id="model-card")
                        heat = gr.Image(label="Where the model looked (cross-attention, red = most)", type="pil",
                                        format="jpeg", interactive=False, height=300, elem_id="heatmap")
                        word = gr.Radio(label="Word", choices=[], type="value", elem_id="word")
                        with gr.Row():
                            layer = gr.Dropdown(layer_choices, value=MEAN, label="Decoder layer")
                            head = gr.Dropdown(head_choices, value=MEAN, label="Attention head")
            explorer_tab = ex.build_tab(cfg, pred.grid)
        pairs = examples()
        if pairs:
            with examples_slot:
                gr.Examples(pairs, inputs=[image, question], label="Examples: sample pictures and Shapes scenes",
                            examples_per_page=8)

        # the answer is shown as soon as it is there; its heatmap is drawn by a second, lighter event (and
        # through the API only when /heatmap is asked for)
        heat_args = dict(fn=handlers.heatmap, inputs=[word, layer, head, state], outputs=heat,
                         concurrency_id="heatmap", concurrency_limit=4, show_progress="hidden")
        gr.on([word.input, layer.input, head.input], **heat_args, api_name="heatmap")
        # a failed request clears the heatmap: it would show the previous picture's beside the error
        asked = gr.on([ask_btn.click, question.submit], handlers.ask, [image, question, top_k, state],
                      [answer, scores, word, note, state], api_name="ask", concurrency_id="model")
        asked.success(**heat_args, api_name="heatmap_after_ask", api_visibility="private")
        asked.failure(lambda: None, None, heat, api_visibility="private", queue=False)
        method.change(lambda m: [gr.update(visible=v) for v in shown_for(m)], method, settings,
                      api_visibility="private", queue=False)
        captioned = cap_btn.click(handlers.caption, [image, method, *settings, state],
                                  [cap_text, cap_details, word, state], api_name="caption", concurrency_id="model")
        captioned.success(**heat_args, api_name="heatmap_after_caption", api_visibility="private")
        captioned.failure(lambda: None, None, heat, api_visibility="private", queue=False)
        ex.wire(explorer_tab, explorer, state, explained)
    demo.batching = server  # for tests and the curious: the batching layer behind /ask and /caption
    return demo
