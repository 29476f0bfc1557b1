"""The vqa demo (Gradio): upload a picture or pick an example, ask a question, caption it, see where the
model looked while it wrote each word, and follow its attention step by step in the attention explorer.

    python app.py                          # runs/tiny if it exists, else a page on how to train one
    python app.py --checkpoint runs/tiny [--host 0.0.0.0] [--port 7860] [--device cuda]
                  [--max-batch 16] [--batch-wait 2] [--concurrency 32] [--queue-size 64]

Serving. Questions and captions from all users go through one batching layer (`vqa.inference.serving`): the requests
that wait together (at most `--max-batch`; the first waits `--batch-wait` ms for company) are answered by one
batched model call, each distinct picture encoded once and its encoding cached by content. `--concurrency`
requests are worked on at once (default 2 x max-batch, so the next batch gathers while one runs) and at most
`--queue-size` more wait (default 2 x concurrency); beyond that a user is told the demo is busy. The answer
is sent as soon as it is there; its heatmap is drawn by a second, lighter event (through the API: only when
/heatmap is asked for), and the explorer's pictures only when its tab is opened. Uploads are capped at 10 MB
and pictures at `vqa.data.images.MAX_PIXELS` (64 megapixels); the server listens on 127.0.0.1 unless
`--host` says otherwise. Bad input (no picture, a file that is not a picture, a truncated or huge one, an
empty question) gets a message that names the file as the user called it, never a path on the server.

The model card says what the model was trained on; when the training pictures are on this machine, each
picture is compared with up to 256 of them (`vqa.demo.familiarity`) and an unusual one gets a warning with its
answer.

For tests and embedding: `build_app(predictor_or_None, max_batch=...) -> gr.Blocks` and
`serve(demo, host, port, concurrency, queue_size)`; the endpoints `/ask`, `/caption`, `/heatmap`, `/explain`
and `/export` keep their names for `gradio_client`.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry calls from a local demo

import argparse
import dataclasses
import json
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from vqa.config import GenerationConfig
from vqa.data.images import MAX_PIXELS
from vqa.errors import VQAError

ROOT = Path(__file__).resolve().parent
SAMPLES = ROOT / "data" / "samples"
SHAPES = ROOT / "data" / "shapes"
DEFAULT_RUN = Path("runs") / "tiny"
MAX_FILE_SIZE = "10mb"
LAUNCH_ATTEMPTS = 3  # launches tried when gradio's start-up check of its own address (~17 s) fails
MAX_QUESTION_CHARS = 1000  # longer questions are cut here, then to the model's context by the tokenizer
DISPLAY_SIDE = 480  # heatmaps are drawn on a copy of the picture this big (longer side)
MEAN = -1  # the layer / head selector value meaning "average them all"
MAX_BATCH = 16  # questions answered by one model call, at most
BATCH_WAIT_MS = 2  # how long the first request of a batch waits for company (a lone request: that much later)
ENCODING_CACHE = 64  # picture encodings kept (by content)
REFERENCE_PICTURES = 256  # training pictures the familiarity check compares with

THEME_FONTS = ["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"]
CSS = """
#answer textarea { font-size: 1.4em; font-weight: 600; }
#caption-text textarea { font-size: 1.2em; }
"""

HOW_TO_TRAIN = """
# vqa demo: no trained model yet

The demo needs a checkpoint and none was found at `runs/tiny`. Train the tiny model on the built-in Shapes set
(about 10 minutes on a laptop CPU), then start the demo again:

```bash
make demo                      # builds data/shapes, trains runs/tiny, evaluates it and serves this app
```

or step by step:

```bash
vqa data shapes --out data/shapes
vqa train --data data/shapes --out runs/tiny --preset tiny --time-limit 10m
python app.py --checkpoint runs/tiny
```

Any run folder (or a checkpoint folder inside one) works with `--checkpoint`.
"""


class Upload(str):
    """The server's path to an uploaded picture (it is that path, as a str) that also remembers the name the
    user gave the file, so messages can name it without showing the server's folders."""

    display_name: str

    def __new__(cls, path: str, display_name: str | None):
        obj = super().__new__(cls, path)
        obj.display_name = display_name or "the uploaded file"
        return obj


def picture_input(**kwargs) -> gr.Image:
    """A gr.Image (type filepath) that hands the function an `Upload` (path + the user's file name), and
    whose decoding failures (a file that is not a picture, a decompression bomb) become a message naming the
    file as the user called it. The guard wraps this one instance's `preprocess`: subclassing gr.Image would
    make gradio write a .pyi stub beside this file."""
    component = gr.Image(type="filepath", **kwargs)
    real = component.preprocess

    def preprocess(payload):
        name = Path(payload.orig_name).name if getattr(payload, "orig_name", None) else None
        shown = f'"{name}"' if name else "the uploaded file"
        try:
            path = real(payload)
        except gr.Error as e:
            raise gr.Error(user_message(str(e), None), title="Not a picture", print_exception=False) from None
        except Exception as e:  # PIL's UnidentifiedImageError, DecompressionBombError, OSError ...
            raise gr.Error(f"Could not read {shown} as a picture ({type(e).__name__}). "
                           "Please upload a PNG, JPEG, WebP, GIF or BMP image.", title="Not a picture",
                           print_exception=False) from None
        return None if path is None else Upload(path, shown)

    component.preprocess = preprocess
    return component


def _server_folders() -> list[str]:
    """Folders whose paths must never reach a user: gradio's upload cache and the temporary folder."""
    roots = {tempfile.gettempdir(), os.environ.get("GRADIO_TEMP_DIR", "")}
    return sorted((r for r in roots if r), key=len, reverse=True)


def user_message(text: str, image: Any) -> str:
    """`text` with the upload's server path replaced by the name the user gave the file (or "the uploaded
    file"), and any other path under the server's temporary folders too."""
    name = getattr(image, "display_name", None) or "the uploaded file"
    if isinstance(image, str) and image:
        text = text.replace(image, name)
    for root in _server_folders():
        text = re.sub(re.escape(root) + r"[^\s'\",;)]*", "the uploaded file", text)
    return text


# ------------------------------------------------------------------------------------------------- helpers


def _fail(e: Exception, image: Any = None) -> gr.Error:
    return gr.Error(user_message(str(e), image), title="Cannot do that", print_exception=False)


def _busy(e: Exception) -> gr.Error:
    return gr.Error(str(e), title="Busy", print_exception=False)


def _question(question: Any) -> tuple[str, list[str]]:
    notes = []
    if not isinstance(question, str) or not question.strip():
        raise gr.Error("Please type a question about the picture.", title="The question is empty",
                       print_exception=False)
    if len(question) > MAX_QUESTION_CHARS:
        question = question[:MAX_QUESTION_CHARS]
        notes.append(f"The question was cut to its first {MAX_QUESTION_CHARS} characters.")
    return question, notes


def _display_copy(img: Image.Image) -> Image.Image:
    """The picture scaled (up or down) so its longer side is DISPLAY_SIDE, to draw heatmaps on."""
    scale = DISPLAY_SIDE / max(img.size)
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    return img.resize(size, Image.Resampling.BICUBIC)


def _word_choices(words: list[str]) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {w}", i) for i, w in enumerate(words)]


def _display_image(pred, state: dict) -> Image.Image:
    """The session's display copy of its picture, made on first use (the answer does not wait for it)."""
    if state.get("image") is None:
        state["image"] = _display_copy(pred.load(state["source"]))
    return state["image"]


def _heatmap(pred, state: dict | None, word: Any, layer: Any, head: Any) -> Image.Image | None:
    from vqa.inference.heatmaps import attention_heatmap

    if not state or not state.get("words"):
        return None
    i = int(word) if word is not None and 0 <= int(word) < len(state["words"]) else 0
    layer = None if layer is None or int(layer) == MEAN else int(layer)
    head = None if head is None or int(head) == MEAN else int(head)
    return attention_heatmap(_display_image(pred, state), state["maps"][i], layer=layer, head=head,
                             image_size=pred.cfg.vit_image_size)


def _state_from(source: Any, result) -> dict:
    """What a session keeps of its last answer or caption: the words and their maps, and what the heatmap and
    the explorer need (the upload's path, the result; the display copy is made when first drawn)."""
    words = result.words()
    maps = np.stack([m.numpy() for _, m in words]) if words else np.zeros((0,))
    return dict(image=None, words=[w for w, _ in words], maps=maps, source=source, result=result)


def _unfamiliar_note(ratio: float | None) -> list[str]:
    if ratio is None or ratio <= 1.0:
        return []
    return ["**This picture looks unlike the pictures the model was trained on** (see the model card): "
            "its answers are only meaningful for pictures like those, so take this one as a guess."]


def decoding_methods() -> tuple[str, ...]:
    from vqa.decoding.generate import METHODS

    return tuple(METHODS)


def _ui_fields() -> list:
    """GenerationConfig's fields that the app shows (those with `ui` metadata), in their order."""
    return [f for f in dataclasses.fields(GenerationConfig) if f.metadata.get("ui")]


def decoding_controls() -> list:
    """One control per GenerationConfig field with `ui` metadata: a slider over its (min, max, step), or a
    number box; labelled with the field's help, set to the caption defaults."""
    defaults = GenerationConfig.for_task("caption")
    out = []
    for f in _ui_fields():
        ui, label = f.metadata["ui"], f"{f.name.replace('_', ' ')} — {f.metadata.get('help', '')}"
        value = getattr(defaults, f.name)
        if ui == "number":
            out.append(gr.Number(value=value if value is not None else 0, precision=0, label=label,
                                 elem_id=f"gen-{f.name}"))
        else:
            lo, hi, step = ui
            out.append(gr.Slider(lo, hi, value=value, step=step, label=label, elem_id=f"gen-{f.name}"))
    return out


def decoding_settings(method: Any, values: Any) -> GenerationConfig:
    """The GenerationConfig of the caption tab's controls (an empty number box: None)."""
    changes = {"method": str(method)}
    for f, v in zip(_ui_fields(), values, strict=True):
        if v is None or v == "":
            changes[f.name] = None
        elif str(f.type).startswith("int"):
            changes[f.name] = int(v)
        else:
            changes[f.name] = float(v)
    return GenerationConfig.for_task("caption", **changes)


def training_data(card: dict) -> tuple[str, Path | None]:
    """What the card says the model was trained on, in words, and that data folder if it is on this
    machine (for the familiarity check)."""
    data = card.get("data")
    if not data:
        return "not recorded in the checkpoint's card", None
    folder = Path(str(data))
    split = card.get("train_split") or "train"
    here = folder if folder.is_dir() else None
    if (folder / "shapes_info.json").is_file() or (here is None and folder.name == "shapes"):
        from vqa.data import shapes_scene

        what = (f"the built-in **Shapes** set (`{data}`, split {split}): synthetic 64 px scenes of 1 to 6 flat "
                f"objects ({', '.join(shapes_scene.SHAPES)}; {len(shapes_scene.COLORS)} colours, 2 sizes) on grey backgrounds, with "
                "questions about colour, shape, existence, counting, position and comparison. It has seen "
                "nothing else: about photographs or other drawings its answers are guesses")
    else:
        what = f"`{data}` (split {split})"
    return what, here


def card_markdown(pred, reference_note: str = "") -> str:
    """The model card: what was loaded, how big it is, what it was trained on (and what that means for other
    pictures) and how it scored."""
    c, cfg = pred.card, pred.cfg
    trained_on, _ = training_data(c)
    lines = ["### Model card", "", f"**Trained on** {trained_on}."]
    if reference_note:
        lines += ["", reference_note]
    rows = [
        ("checkpoint", f"`{pred.path}`" if pred.path else "in memory"),
        ("preset", c.get("preset", "?")),
        ("parameters", f"{pred.model.num_parameters():,}"),
        ("image encoder", f"{cfg.vit_name}, {cfg.vit_image_size} px in {cfg.vit_patch_size} px patches"
                          f" ({pred.grid}x{pred.grid}), width {cfg.vit_width or 'timm default'}, depth "
                          f"{cfg.vit_depth or 'timm default'}"),
        ("text decoder", f"{cfg.dec_depth} layers, width {cfg.dec_width}, {cfg.dec_heads} heads, "
                         f"{cfg.vocab_size} tokens, context {cfg.dec_max_len}"),
        ("trained on", f"`{c['data']}`" + (f" ({c['train_split']})" if c.get("train_split") else "")
         if c.get("data") else "?"),
        ("tasks", ", ".join(c.get("tasks", [])) or "?"),
        ("steps", c.get("step", "?")),
        ("device", str(pred.device)),
    ]
    lines += ["", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    scores = c.get("val_scores") or {}
    from vqa.evaluation.evaluate import flatten

    flat = flatten(scores, sep=" / ")
    if flat:
        lines += ["", f"**Scores on {c.get('val_split', 'val')}**", "", "| metric | value |", "|---|---|"]
        for k, v in flat.items():
            lines.append(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |")
    return "\n".join(lines)


def start_reference(server, pred, reference: Any) -> str:
    """Give `server` its familiarity reference: a `Familiarity`, None (no check) or "auto" (built now from up
    to REFERENCE_PICTURES training pictures named in the card, when that folder is on this machine: a few
    seconds at start-up for the tiny model). Returns the model card's sentence about the check."""
    if reference is None:
        return ""
    if reference == "auto":
        from vqa.demo.familiarity import Familiarity

        _, folder = training_data(pred.card)
        if folder is None:
            data = pred.card.get("data")
            return (f"The training pictures (`{data}`) are not on this machine, so pictures cannot be compared "
                    "with them: no warning is given for unusual pictures.") if data else ""
        try:
            reference = Familiarity.from_data(pred, folder, pred.card.get("train_split") or "train",
                                              n=REFERENCE_PICTURES)
        except (VQAError, OSError) as e:
            print(f"app.py: no familiarity check: {e}", file=sys.stderr)
            return f"The training pictures could not be read ({e}): no warning is given for unusual pictures."
    server.familiarity = reference
    return (f"Each picture is compared with {reference.source or 'reference pictures'} in the model's own "
            "features (`vqa.demo.familiarity`); one unlike all of them gets a warning with its answer.")


def examples() -> list[list[str]]:
    """[image path, question] pairs: the sample pictures, then a few Shapes val images if the set is built."""
    out = []
    meta = SAMPLES / "samples.json"
    if meta.is_file():
        for e in json.loads(meta.read_text()):
            if (SAMPLES / e["file"]).is_file():
                out.append([str(SAMPLES / e["file"]), e["question"]])
    qfile = SHAPES / "v2_OpenEnded_mscoco_val_questions.json"
    if qfile.is_file():
        try:
            seen = set()
            for q in json.loads(qfile.read_text())["questions"]:
                path = SHAPES / "val" / f"COCO_val_{q['image_id']:012d}.png"
                if q["image_id"] not in seen and path.is_file():
                    seen.add(q["image_id"])
                    out.append([str(path), q["question"]])
                if len(seen) >= 6:
                    break
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a half-built set: no Shapes examples
    return out


# ------------------------------------------------------------------------------------------------- the explorer

EXPLORER_INTRO = """
### How the model read the picture
Ask a question or caption a picture first; this tab then explains that last answer with the model's own
attention weights, read on a separate pass. **Masked self-attention**: how each token of the prompt and the
answer reads the tokens before it (rows: the reading token; the grey triangle is masked). **Cross-attention**:
where a generated word looks in the picture, in every decoder layer and head. **Query against the keys**: the
two steps of attention for that word: the raw scores q.k/sqrt(d), then the softmax. **ViT**: where one image
patch looks inside the image encoder (by default the patch the word looks at most), so it can be followed
into the ViT and out to the word. Export writes the pictures as PNG and every array as `.npz`.
"""


def _explorer_views(e, token: int, layer: int, head: int, row: int, col: int) -> tuple:
    from vqa.inference import figures as af

    head_one = None if head == MEAN else head
    return (af.self_attention_figure(e, layer, head_one), af.cross_attention_grid(e, token),
            af.query_keys_figure(e, token, layer, 0 if head == MEAN else head), af.vit_patch_figure(e, row, col))


def _explorer_choices(e) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {t}", i) for i, t in enumerate(e.generated)]


# ------------------------------------------------------------------------------------------------- the app


def build_app(pred=None, max_batch: int = MAX_BATCH, batch_wait_ms: float = BATCH_WAIT_MS,
              reference: Any = "auto") -> gr.Blocks:
    """The demo around a `vqa.Predictor`; with None, a page that explains how to train a model.
    `max_batch` / `batch_wait_ms`: the batching layer's settings; `reference`: the familiarity check ("auto":
    from the training data named in the card, if it is on this machine; None: off; or a `Familiarity`)."""
    if pred is None:
        with gr.Blocks(title="vqa demo: no model") as demo:
            gr.Markdown(HOW_TO_TRAIN, elem_id="how-to-train")
        return demo

    from vqa.inference.serving import BatchedPredictor, Busy

    cfg = pred.cfg
    server = BatchedPredictor(pred, max_batch=max_batch, max_wait=batch_wait_ms / 1000, attention=True)
    reference_note = start_reference(server, pred, reference)
    layer_choices = [("mean of all layers", MEAN)] + [(f"layer {i + 1}", i) for i in range(cfg.dec_depth)]
    head_choices = [("mean of all heads", MEAN)] + [(f"head {i + 1}", i) for i in range(cfg.dec_heads)]

    def ask(image, question, top_k, state):
        if image is None:
            raise gr.Error("Please upload a picture or pick an example first.", title="No picture",
                           print_exception=False)
        question, notes = _question(question)
        try:
            res, ratio = server.answer(pred.load(image), question, int(top_k))
            state = _state_from(image, res)
        except Busy as e:
            raise _busy(e) from None
        except VQAError as e:
            raise _fail(e, image) from None
        notes += _unfamiliar_note(ratio)
        if res.truncated:
            notes.append("The question was too long for the model: only its first "
                         f"{pred.tokenizer.max_question_tokens(cfg.dec_max_len)} tokens were read.")
        if pred.tokenizer.unk_id in pred.tokenizer.encode(question):
            notes.append("Some characters (emoji, or a script the model never saw) are unknown to this model "
                         "and were read as `<unk>`.")
        label = {a or "(empty)": p for a, p in res.top_k}
        words = gr.Radio(choices=_word_choices(state["words"]), value=0 if state["words"] else None)
        return res.answer, label, words, "\n\n".join(notes), state

    def caption(image, method, *values):
        *values, state = values
        if image is None:
            raise gr.Error("Please upload a picture or pick an example first.", title="No picture",
                           print_exception=False)
        try:
            settings = decoding_settings(method, values)
            res, ratio = server.caption(pred.load(image), settings)
            state = _state_from(image, res)
        except Busy as e:
            raise _busy(e) from None
        except VQAError as e:
            raise _fail(e, image) from None
        except (TypeError, ValueError) as e:
            raise gr.Error(f"Bad decoding setting: {e}", print_exception=False) from None
        if res.beams:
            details = "\n".join(f"{i}. {c or '(empty)'} — log-prob {s:.2f}" for i, (c, s) in enumerate(res.beams, 1))
        else:
            details = f"log-prob {res.log_prob:.2f} ({settings.method}" + (
                f", seed {settings.seed})" if settings.method == "sample" else ")")
        details = "\n\n".join([details, *_unfamiliar_note(ratio)])
        words = gr.Radio(choices=_word_choices(state["words"]), value=0 if state["words"] else None)
        return res.caption, details, words, state

    def heatmap(word, layer, head, state):
        try:
            return _heatmap(pred, state, word, layer, head)
        except (VQAError, ValueError, TypeError, IndexError) as e:
            raise _fail(e, (state or {}).get("source")) from None

    # ---- the attention explorer ----
    def explain(state):
        """Explain the session's last answer or caption: the Explanation, the controls set for it, the views."""
        from vqa.inference.figures import top_patch

        if not state or state.get("result") is None:  # opened before any question: say what to do
            return (None, gr.Dropdown(choices=[], value=None), gr.Dropdown(), gr.Dropdown(), gr.Slider(),
                    gr.Slider(), "*Ask a question or caption a picture first; this tab then explains the answer.*",
                    None, None, None, None)
        try:
            e = pred.explain(state["source"], result=state["result"])
        except VQAError as err:
            raise _fail(err, state["source"]) from None
        e.image = _display_image(pred, state)  # draw on the display copy
        layer, head = cfg.dec_depth - 1, MEAN
        row, col = top_patch(e, 0)
        views = _explorer_views(e, 0, layer, head, row, col)
        what = f'"{e.question}" → "{e.text}"' if e.question is not None else f'caption: "{e.text}"'
        info = (f"Explaining {what}: {len(e.tokens)} tokens ({e.prompt_len} of prompt), {cfg.dec_depth} decoder "
                f"layers x {cfg.dec_heads} heads, a {e.grid}x{e.grid} patch grid.")
        token = gr.Dropdown(choices=_explorer_choices(e), value=0 if e.generated else None)
        return (e, token, gr.Dropdown(value=layer), gr.Dropdown(value=head), gr.Slider(value=row + 1),
                gr.Slider(value=col + 1), info, *views)

    def _check(e):
        if e is None:
            raise gr.Error("Open this tab after asking a question or captioning a picture.",
                           title="Nothing to explain yet", print_exception=False)

    def redraw_self(e, token, layer, head):
        from vqa.inference import figures as af

        _check(e)
        token, layer, head = int(token or 0), int(layer), int(head)
        qk = af.query_keys_figure(e, token, layer, 0 if head == MEAN else head)
        return af.self_attention_figure(e, layer, None if head == MEAN else head), qk

    def redraw_token(e, token, layer, head):
        from vqa.inference import figures as af

        _check(e)
        token, layer, head = int(token or 0), int(layer), int(head)
        row, col = af.top_patch(e, token)
        return (af.cross_attention_grid(e, token), af.query_keys_figure(e, token, layer, 0 if head == MEAN else head),
                af.vit_patch_figure(e, row, col), gr.Slider(value=row + 1), gr.Slider(value=col + 1))

    def redraw_patch(e, row, col):
        from vqa.inference import figures as af

        _check(e)
        return af.vit_patch_figure(e, int(row) - 1, int(col) - 1)

    def export(e, token, layer, head, row, col):
        _check(e)
        folder = Path(tempfile.mkdtemp(prefix="vqa-attention-"))
        files = e.save(folder, tokens=[int(token or 0)] if e.generated else [], layer=int(layer),
                       head=0 if int(head) == MEAN else int(head), patch=(int(row) - 1, int(col) - 1))
        return [str(f) for f in files]

    with gr.Blocks(title="vqa demo", delete_cache=(3600, 3600)) as demo:
        state = gr.State(None)
        explained = gr.State(None)
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
                                question = gr.Textbox(label="Question", placeholder="what color is the circle?",
                                                      max_length=MAX_QUESTION_CHARS, elem_id="question")
                                with gr.Row(equal_height=True):
                                    top_k = gr.Slider(1, 5, value=3, step=1, label="Answers to list (top-k)",
                                                      scale=3)
                                    ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-button", scale=1)
                                with gr.Row():
                                    answer = gr.Textbox(label="Answer", interactive=False, elem_id="answer",
                                                        scale=2)
                                    scores = gr.Label(label="Top answers (probability of each exact answer)",
                                                      show_heading=False, elem_id="top-answers", scale=3)
                                note = gr.Markdown(elem_id="note")
                            with gr.Tab("Caption", id="caption"):
                                method = gr.Dropdown(list(decoding_methods()), value="greedy",
                                                     label="Decoding method", elem_id="method")
                                with gr.Row():
                                    settings = decoding_controls()
                                cap_btn = gr.Button("Caption", variant="primary", elem_id="caption-button")
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
            with gr.Tab("Attention explorer", id="explorer", elem_id="explorer-tab") as explorer_tab:
                gr.Markdown(EXPLORER_INTRO)
                with gr.Row(equal_height=True):
                    ex_token = gr.Dropdown([], label="Generated token (its query)", elem_id="ex-token", scale=2)
                    ex_layer = gr.Dropdown([(f"layer {i + 1}", i) for i in range(cfg.dec_depth)],
                                           value=cfg.dec_depth - 1, label="Decoder layer", elem_id="ex-layer")
                    ex_head = gr.Dropdown([("every head and the mean", MEAN)]
                                          + [(f"head {i + 1}", i) for i in range(cfg.dec_heads)],
                                          value=MEAN, label="Head", elem_id="ex-head")
                    ex_row = gr.Slider(1, pred.grid, value=1, step=1, label="ViT: patch row", elem_id="ex-row")
                    ex_col = gr.Slider(1, pred.grid, value=1, step=1, label="ViT: patch column", elem_id="ex-col")
                with gr.Row():
                    explain_btn = gr.Button("Explain the last answer", variant="primary", elem_id="explain-button")
                    export_btn = gr.Button("Export (PNG + .npz)", elem_id="export-button")
                ex_info = gr.Markdown(elem_id="explorer-info")
                with gr.Row():
                    self_img = gr.Image(label="Masked self-attention (prompt + generated tokens)", type="pil",
                                        format="png", interactive=False, show_label=False,
                                        elem_id="self-attention")
                    cross_img = gr.Image(label="Cross-attention of the token: layers x heads", type="pil",
                                         format="png", interactive=False, show_label=False,
                                        elem_id="cross-grid")
                qk_img = gr.Image(label="The token's query against every image key: scores, then softmax",
                                  type="pil", format="png", interactive=False, show_label=False,
                                        elem_id="query-keys")
                with gr.Row():
                    vit_img = gr.Image(label="Inside the ViT: self-attention from one patch", type="pil",
                                       format="png", interactive=False, show_label=False,
                                        elem_id="vit-attention")
                    files = gr.File(label="Export", file_count="multiple", interactive=False, elem_id="export")
        ex = examples()
        if ex:
            with examples_slot:
                gr.Examples(ex, inputs=[image, question], label="Examples: sample pictures and Shapes scenes",
                            examples_per_page=8)

        # the answer is shown as soon as it is there; its heatmap is drawn by a second, lighter event (and
        # through the API only when /heatmap is asked for)
        heat_args = dict(fn=heatmap, inputs=[word, layer, head, state], outputs=heat, concurrency_id="heatmap",
                         concurrency_limit=4, show_progress="hidden")
        gr.on([word.input, layer.input, head.input], **heat_args, api_name="heatmap")
        gr.on([ask_btn.click, question.submit], ask, [image, question, top_k, state],
              [answer, scores, word, note, state], api_name="ask", concurrency_id="model").success(
            **heat_args, api_name="heatmap_after_ask", api_visibility="private")
        cap_btn.click(caption, [image, method, *settings, state], [cap_text, cap_details, word, state],
                      api_name="caption", concurrency_id="model").success(
            **heat_args, api_name="heatmap_after_caption", api_visibility="private")
        views = [self_img, cross_img, qk_img, vit_img]
        gr.on([explain_btn.click, explorer_tab.select], explain, [state],
              [explained, ex_token, ex_layer, ex_head, ex_row, ex_col, ex_info, *views], api_name="explain",
              concurrency_id="explain", concurrency_limit=2)
        gr.on([ex_layer.input, ex_head.input], redraw_self, [explained, ex_token, ex_layer, ex_head],
              [self_img, qk_img], concurrency_id="explain", api_visibility="undocumented")
        ex_token.input(redraw_token, [explained, ex_token, ex_layer, ex_head],
                       [cross_img, qk_img, vit_img, ex_row, ex_col], concurrency_id="explain", api_visibility="undocumented")
        gr.on([ex_row.release, ex_col.release], redraw_patch, [explained, ex_row, ex_col], vit_img,
              concurrency_id="explain", api_visibility="undocumented")
        export_btn.click(export, [explained, ex_token, ex_layer, ex_head, ex_row, ex_col], files,
                         api_name="export", concurrency_id="explain")
    demo.batching = server  # for tests and the curious: the batching layer behind /ask and /caption
    return demo


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
                              ssr_mode=False, max_threads=threads)
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
    from vqa.errors import CheckpointError
    from vqa.inference.predict import Predictor
    from vqa.model.checkpoint import resolve

    if checkpoint is None:
        try:
            resolve(DEFAULT_RUN)
        except CheckpointError:
            return None
        checkpoint = str(DEFAULT_RUN)
    return Predictor.from_pretrained(checkpoint, device=device, max_pixels=MAX_PIXELS, cache_size=ENCODING_CACHE,
                                     quantize="int8" if int8 else None, compile=compile)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Serve the vqa demo (Gradio).")
    p.add_argument("--checkpoint", default=None, metavar="RUN",
                   help=f"a run or checkpoint folder (default: {DEFAULT_RUN} if it holds one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=None, help="port (default 7860, or the next free one)")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: CUDA, else MPS, else CPU)")
    p.add_argument("--int8", action="store_true",
                   help="dynamic int8 linear layers on a CPU (4x smaller weights; compiled, faster): "
                        "docs/performance.md has the speed and the accuracy change")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="decode through the torch.compile'd step (default: on CUDA, and with --int8); the first "
                        "answers of each batch size wait seconds for the compiler")
    p.add_argument("--max-batch", type=int, default=MAX_BATCH,
                   help=f"questions answered by one batched model call, at most (default {MAX_BATCH})")
    p.add_argument("--batch-wait", type=float, default=BATCH_WAIT_MS, metavar="MS",
                   help=f"how long a batch waits for more questions, in ms (default {BATCH_WAIT_MS})")
    p.add_argument("--concurrency", type=int, default=None,
                   help="requests worked on at once (default 2 x --max-batch)")
    p.add_argument("--queue-size", type=int, default=None,
                   help="requests that may wait beyond those (default 2 x --concurrency); more are told the "
                        "demo is busy")
    args = p.parse_args(argv)
    if args.max_batch < 1 or args.batch_wait < 0:
        p.error("--max-batch must be at least 1 and --batch-wait at least 0")
    try:
        concurrency, queue_size = queue_sizes(args.max_batch, args.concurrency, args.queue_size)
    except ValueError as e:
        p.error(str(e))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            pred = load_predictor(args.checkpoint, args.device, int8=args.int8, compile=args.compile)
        for w in caught:  # int8 that cannot run here: say so once, on the console
            print(f"app.py: {w.message}", file=sys.stderr)
    except VQAError as e:
        print(f"app.py: error: {e}", file=sys.stderr)
        return 2
    if pred is None:
        print(f"app.py: no checkpoint at {DEFAULT_RUN}; serving a page that explains how to train one "
              "(`make demo`)", file=sys.stderr)
    demo = build_app(pred, max_batch=args.max_batch, batch_wait_ms=args.batch_wait)
    try:
        _, url, _ = serve(demo, args.host, args.port, concurrency, queue_size, block=False, quiet=True)
    except OSError as e:
        print(f"app.py: error: cannot listen on {args.host}:{args.port or 7860}: {e}", file=sys.stderr)
        return 2
    what = f"model {pred.path} on {pred.device} ({pred.precision})" if pred else "no model (how-to page)"
    print(f"vqa demo: serving {what} at {url} (batches of up to {args.max_batch}, {concurrency} at once, "
          f"{queue_size} waiting; Ctrl+C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
