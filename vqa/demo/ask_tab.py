"""The "Ask and caption" tab's components (`build_tab`: the picture and its examples; the Ask, Caption, Find
and Model card tabs; the heatmap and its word / layer / head selectors), returned as an `AskTab`; the
decoding controls shown for each method (`decoding_controls`, `shown_for`); the example pictures (`examples`:
the samples shipped inside the package, then Shapes scenes when `data/shapes` is built; the server lets the
page read these two folders and no other). Components only: `vqa.demo.app` assembles the page and wires them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from ..config import DECODING_METHODS, GenerationConfig
from ..data.samples import SAMPLES, sample_entries
from .handlers import MAX_QUESTION_CHARS, MEAN, ui_fields
from .uploads import picture_input

MAX_TOP_K = GenerationConfig.ui_bounds("num_beams")[1]  # answers listed at most: beams (the top-k slider)
SHAPES = Path("data") / "shapes"  # relative: the folder the demo is started from, as for runs/tiny


def examples() -> list[list[str]]:
    """[image path, question] pairs: the sample pictures, then a few Shapes val images if the set is built."""
    out = [[str(SAMPLES / e["file"]), e["question"]] for e in sample_entries()]
    shapes = SHAPES.resolve()
    qfile = shapes / "v2_OpenEnded_mscoco_val_questions.json"
    if qfile.is_file():
        try:
            seen = set()
            for q in json.loads(qfile.read_text())["questions"]:
                path = shapes / "val" / f"COCO_val_{q['image_id']:012d}.png"
                if q["image_id"] not in seen and path.is_file():
                    seen.add(q["image_id"])
                    out.append([str(path), q["question"]])
                if len(seen) >= 6:
                    break
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a half-built set: no Shapes examples
    return out


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


@dataclass
class AskTab:
    """The "Ask and caption" tab's components that events read or write."""

    image: gr.Image
    question: gr.Textbox
    top_k: gr.Slider
    ask_btn: gr.Button
    ask_stop: gr.Button
    answer: gr.Textbox
    scores: gr.Label
    note: gr.Markdown
    method: gr.Dropdown
    settings: list
    cap_btn: gr.Button
    cap_stop: gr.Button
    cap_text: gr.Textbox
    cap_details: gr.Markdown
    heat: gr.Image
    word: gr.Radio
    layer: gr.Dropdown
    head: gr.Dropdown
    find_object: gr.Textbox
    find_btn: gr.Button
    found_picture: gr.Image
    found_line: gr.Markdown


def build_tab(cfg, tasks, card: str) -> AskTab:
    """The "Ask and caption" tab, inside the page's gr.Tabs, for a decoder of `cfg` trained for `tasks` (a
    task it was not trained for: its tab says why and its button is disabled); `card`: the Model card tab's
    markdown. The example pictures go beside the picture."""
    layer_choices = [("mean of all layers", MEAN)] + [(f"layer {i + 1}", i) for i in range(cfg.cross_layers)]
    head_choices = [("mean of all heads", MEAN)] + [(f"head {i + 1}", i) for i in range(cfg.dec_heads)]
    with gr.Tab("Ask and caption", id="demo"):
        with gr.Row():
            with gr.Column(scale=5):
                image = picture_input(label="Picture", sources=["upload", "clipboard"], height=300,
                                      elem_id="picture")
                examples_slot = gr.Column()
            with gr.Column(scale=6):
                with gr.Tabs():
                    with gr.Tab("Ask", id="ask"):
                        asks = "vqa" in tasks  # a captioner's Ask tab says why it is disabled
                        if not asks:
                            gr.Markdown(untrained_note("vqa", tasks), elem_id="ask-untrained")
                        question = gr.Textbox(label="Question", placeholder="what color is the circle?",
                                              max_length=MAX_QUESTION_CHARS, elem_id="question", interactive=asks)
                        with gr.Row(equal_height=True):
                            top_k = gr.Slider(1, MAX_TOP_K, value=3, step=1, label="Answers to list (top-k)",
                                              scale=3)
                            ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-button", scale=1,
                                                interactive=asks)
                            ask_stop = gr.Button("Stop", variant="stop", elem_id="ask-stop", scale=1, min_width=60)
                        with gr.Row():
                            answer = gr.Textbox(label="Answer", interactive=False, elem_id="answer", scale=2)
                            scores = gr.Label(label="Top answers (probability of each exact answer)",
                                              show_heading=False, elem_id="top-answers", scale=3)
                        note = gr.Markdown(elem_id="note")
                    with gr.Tab("Caption", id="caption"):
                        captions = "caption" in tasks
                        if not captions:
                            gr.Markdown(untrained_note("caption", tasks), elem_id="caption-untrained")
                        method = gr.Dropdown(list(DECODING_METHODS), value="greedy", label="Decoding method",
                                             elem_id="method")
                        with gr.Row():
                            settings = decoding_controls()
                        with gr.Row():
                            cap_btn = gr.Button("Caption", variant="primary", elem_id="caption-button",
                                                interactive=captions, scale=3)
                            cap_stop = gr.Button("Stop", variant="stop", elem_id="caption-stop", scale=1)
                        cap_text = gr.Textbox(label="Caption", interactive=False, elem_id="caption-text")
                        cap_details = gr.Markdown(elem_id="caption-details")
                    with gr.Tab("Find", id="find"):  # where the model says a named object is
                        if not asks:
                            gr.Markdown(untrained_note("vqa", tasks), elem_id="find-untrained")
                        with gr.Row(equal_height=True):
                            find_object = gr.Textbox(label="Object to find", placeholder="the red circle",
                                                     max_length=MAX_QUESTION_CHARS, elem_id="find-object",
                                                     interactive=asks, scale=4)
                            find_btn = gr.Button("Find", variant="primary", elem_id="find-button", scale=1,
                                                 interactive=asks)
                        found_line = gr.Markdown(elem_id="found-line")
                        found_picture = gr.Image(label="Where the model says it is (box and ring)", type="pil",
                                                 format="png", interactive=False, height=300,
                                                 elem_id="found-picture")
                    with gr.Tab("Model card", id="card"):
                        gr.Markdown(card, elem_id="model-card")
                heat = gr.Image(label="Where the model looked (cross-attention, red = most)", type="pil",
                                format="jpeg", interactive=False, height=300, elem_id="heatmap")
                word = gr.Radio(label="Word", choices=[], type="value", elem_id="word")
                with gr.Row():
                    layer = gr.Dropdown(layer_choices, value=MEAN, label="Decoder layer")
                    head = gr.Dropdown(head_choices, value=MEAN, label="Attention head")
    pairs = examples()
    if pairs:
        with examples_slot:
            gr.Examples(pairs, inputs=[image, question], label="Examples: sample pictures and Shapes scenes",
                        examples_per_page=8)
    return AskTab(image, question, top_k, ask_btn, ask_stop, answer, scores, note, method, settings, cap_btn,
                  cap_stop, cap_text, cap_details, heat, word, layer, head, find_object, find_btn, found_picture,
                  found_line)

