"""The vqa demo (Gradio): upload a picture or pick an example, ask a question, caption it, and see where the
model looked while it wrote each word.

    python app.py                          # runs/tiny if it exists, else a page on how to train one
    python app.py --checkpoint runs/tiny [--host 0.0.0.0] [--port 7860] [--device cuda]

Serving: requests wait in one queue and the model runs one at a time (`--concurrency`), the queue holds at
most `--queue-size` requests (later ones are told it is full), uploads are capped at 10 MB and pictures at
`vqa.data.images.MAX_PIXELS` (64 megapixels), and the server listens on 127.0.0.1 unless `--host` says otherwise. Bad input (no picture, a
file that is not a picture, a huge picture, an empty question) gets a message, never a crash. A second
question about the same picture reuses its encoding (the Predictor's cache).

For tests and embedding: `build_app(predictor_or_None) -> gr.Blocks` and `serve(demo, host, port)`; the
endpoints `/ask`, `/caption` and `/heatmap` keep their names for `gradio_client`.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry calls from a local demo

import argparse
import dataclasses
import json
import sys
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
MAX_QUESTION_CHARS = 1000  # longer questions are cut here, then to the model's context by the tokenizer
DISPLAY_SIDE = 480  # heatmaps are drawn on a copy of the picture this big (longer side)
MEAN = -1  # the layer / head selector value meaning "average them all"

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


def picture_input(**kwargs) -> gr.Image:
    """A gr.Image (type filepath) whose upload decoding failures (a file that is not a picture, a
    decompression bomb) become a message for the user instead of a bare "Error". The guard wraps this one
    instance's `preprocess`: subclassing gr.Image would make gradio write a .pyi stub beside this file."""
    component = gr.Image(type="filepath", **kwargs)
    real = component.preprocess

    def preprocess(payload):
        try:
            return real(payload)
        except gr.Error:
            raise
        except Exception as e:  # PIL's UnidentifiedImageError, DecompressionBombError, OSError ...
            name = getattr(payload, "orig_name", None) or "the file"
            raise gr.Error(f"Could not read {name} as a picture ({type(e).__name__}). "
                           "Please upload a PNG, JPEG, WebP, GIF or BMP image.", title="Not a picture",
                           print_exception=False) from None

    component.preprocess = preprocess
    return component


# ------------------------------------------------------------------------------------------------- helpers


def _fail(e: Exception) -> gr.Error:
    return gr.Error(str(e), title="Cannot do that", print_exception=False)


def _question(question: Any) -> tuple[str, list[str]]:
    notes = []
    if not isinstance(question, str) or not question.strip():
        raise gr.Error("Please type a question about the picture.", title="The question is empty",
                       print_exception=False)
    if len(question) > MAX_QUESTION_CHARS:
        question = question[:MAX_QUESTION_CHARS]
        notes.append(f"The question was cut to its first {MAX_QUESTION_CHARS} characters.")
    return question, notes


def _display_copy(pred, image: Any) -> Image.Image:
    """The picture scaled (up or down) so its longer side is DISPLAY_SIDE, to draw heatmaps on."""
    img = pred.load(image)
    scale = DISPLAY_SIDE / max(img.size)
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    return img.resize(size, Image.Resampling.BICUBIC)


def _word_choices(words: list[str]) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {w}", i) for i, w in enumerate(words)]


def _heatmap(pred, state: dict | None, word: Any, layer: Any, head: Any) -> Image.Image | None:
    from vqa.heatmaps import attention_heatmap

    if not state or not state.get("words"):
        return None
    i = int(word) if word is not None and 0 <= int(word) < len(state["words"]) else 0
    layer = None if layer is None or int(layer) == MEAN else int(layer)
    head = None if head is None or int(head) == MEAN else int(head)
    return attention_heatmap(state["image"], state["maps"][i], layer=layer, head=head,
                             image_size=pred.cfg.vit_image_size)


def _state_from(pred, image: Any, result) -> dict:
    words = result.words()
    maps = np.stack([m.numpy() for _, m in words]) if words else np.zeros((0,))
    return dict(image=_display_copy(pred, image), words=[w for w, _ in words], maps=maps)


def decoding_methods() -> tuple[str, ...]:
    from vqa.generate import METHODS

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


def card_markdown(pred) -> str:
    """The model card: what was loaded, how big it is, what it was trained on and how it scored."""
    c, cfg = pred.card, pred.cfg
    lines = ["### Model card", ""]
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
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    scores = c.get("val_scores") or {}
    from vqa.evaluate import flatten

    flat = flatten(scores, sep=" / ")
    if flat:
        lines += ["", f"**Scores on {c.get('val_split', 'val')}**", "", "| metric | value |", "|---|---|"]
        for k, v in flat.items():
            lines.append(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |")
    return "\n".join(lines)


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


# ------------------------------------------------------------------------------------------------- the app


def build_app(pred=None) -> gr.Blocks:
    """The demo around a `vqa.Predictor`; with None, a page that explains how to train a model."""
    if pred is None:
        with gr.Blocks(title="vqa demo: no model") as demo:
            gr.Markdown(HOW_TO_TRAIN, elem_id="how-to-train")
        return demo

    cfg = pred.cfg
    layer_choices = [("mean of all layers", MEAN)] + [(f"layer {i + 1}", i) for i in range(cfg.dec_depth)]
    head_choices = [("mean of all heads", MEAN)] + [(f"head {i + 1}", i) for i in range(cfg.dec_heads)]

    def ask(image, question, top_k, state):
        if image is None:
            raise gr.Error("Please upload a picture or pick an example first.", title="No picture",
                           print_exception=False)
        question, notes = _question(question)
        try:
            res = pred.answer(image, question, top_k=int(top_k), return_attention=True)
            state = _state_from(pred, image, res)
        except VQAError as e:
            raise _fail(e) from None
        if res.truncated:
            notes.append("The question was too long for the model: only its first "
                         f"{pred.tokenizer.max_question_tokens(cfg.dec_max_len)} tokens were read.")
        if pred.tokenizer.unk_id in pred.tokenizer.encode(question):
            notes.append("Some characters (emoji, or a script the model never saw) are unknown to this model "
                         "and were read as `<unk>`.")
        label = {a or "(empty)": p for a, p in res.top_k}
        heat = _heatmap(pred, state, 0, MEAN, MEAN)
        words = gr.Radio(choices=_word_choices(state["words"]), value=0 if state["words"] else None)
        return res.answer, label, heat, words, "\n\n".join(notes), state

    def caption(image, method, *values):
        *values, state = values
        if image is None:
            raise gr.Error("Please upload a picture or pick an example first.", title="No picture",
                           print_exception=False)
        try:
            settings = decoding_settings(method, values)
            res = pred.caption(image, settings, return_attention=True)
            state = _state_from(pred, image, res)
        except VQAError as e:
            raise _fail(e) from None
        except (TypeError, ValueError) as e:
            raise gr.Error(f"Bad decoding setting: {e}", print_exception=False) from None
        if res.beams:
            details = "\n".join(f"{i}. {c or '(empty)'} — log-prob {s:.2f}" for i, (c, s) in enumerate(res.beams, 1))
        else:
            details = f"log-prob {res.log_prob:.2f} ({settings.method}" + (
                f", seed {settings.seed})" if settings.method == "sample" else ")")
        heat = _heatmap(pred, state, 0, MEAN, MEAN)
        words = gr.Radio(choices=_word_choices(state["words"]), value=0 if state["words"] else None)
        return res.caption, details, heat, words, state

    def heatmap(word, layer, head, state):
        try:
            return _heatmap(pred, state, word, layer, head)
        except (VQAError, ValueError, TypeError, IndexError) as e:
            raise _fail(e) from None

    with gr.Blocks(title="vqa demo", delete_cache=(3600, 3600)) as demo:
        state = gr.State(None)
        gr.Markdown("# vqa: ask about a picture\nUpload a picture (or pick an example), then ask a question or "
                    "caption it. The heatmap shows where the model looked while it wrote each word.")
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
                            top_k = gr.Slider(1, 5, value=3, step=1, label="Answers to list (top-k)", scale=3)
                            ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-button", scale=1)
                        with gr.Row():
                            answer = gr.Textbox(label="Answer", interactive=False, elem_id="answer", scale=2)
                            scores = gr.Label(label="Top answers (probability of each exact answer)",
                                              show_heading=False, elem_id="top-answers", scale=3)
                        note = gr.Markdown(elem_id="note")
                    with gr.Tab("Caption", id="caption"):
                        method = gr.Dropdown(list(decoding_methods()), value="greedy", label="Decoding method",
                                             elem_id="method")
                        with gr.Row():
                            settings = decoding_controls()
                        cap_btn = gr.Button("Caption", variant="primary", elem_id="caption-button")
                        cap_text = gr.Textbox(label="Caption", interactive=False, elem_id="caption-text")
                        cap_details = gr.Markdown(elem_id="caption-details")
                    with gr.Tab("Model card", id="card"):
                        gr.Markdown(card_markdown(pred), elem_id="model-card")
                heat = gr.Image(label="Where the model looked (cross-attention, red = most)", type="pil",
                                format="png", interactive=False, height=300, elem_id="heatmap")
                word = gr.Radio(label="Word", choices=[], type="value", elem_id="word")
                with gr.Row():
                    layer = gr.Dropdown(layer_choices, value=MEAN, label="Decoder layer")
                    head = gr.Dropdown(head_choices, value=MEAN, label="Attention head")
        ex = examples()
        if ex:
            with examples_slot:
                gr.Examples(ex, inputs=[image, question], label="Examples: sample pictures and Shapes scenes",
                            examples_per_page=8)

        gr.on([ask_btn.click, question.submit], ask, [image, question, top_k, state],
              [answer, scores, heat, word, note, state], api_name="ask", concurrency_id="model")
        cap_btn.click(caption, [image, method, *settings, state],
                      [cap_text, cap_details, heat, word, state], api_name="caption", concurrency_id="model")
        gr.on([word.input, layer.input, head.input], heatmap, [word, layer, head, state], heat,
              api_name="heatmap", concurrency_limit=4, show_progress="hidden")
    return demo


def serve(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None, concurrency: int = 1,
          queue_size: int = 16, block: bool = True, quiet: bool = False):
    """Queue and launch `demo`; returns gradio's (app, local_url, share_url). With `block`, serves until
    interrupted."""
    demo.queue(default_concurrency_limit=concurrency, max_size=queue_size)
    theme = gr.themes.Soft(font=THEME_FONTS, font_mono=["ui-monospace", "monospace"])  # no web fonts: works offline
    out = demo.launch(server_name=host, server_port=port, max_file_size=MAX_FILE_SIZE, prevent_thread_lock=True,
                      quiet=quiet, show_error=False, theme=theme, css=CSS, footer_links=["api", "gradio"],
                      allowed_paths=[str(SAMPLES), str(SHAPES)], ssr_mode=False)
    if block:
        demo.block_thread()
    return out


def load_predictor(checkpoint: str | None, device: str | None = None):
    """The Predictor of `checkpoint`; None when no checkpoint was named and runs/tiny holds none."""
    from vqa.checkpoint import resolve
    from vqa.errors import CheckpointError
    from vqa.predict import Predictor

    if checkpoint is None:
        try:
            resolve(DEFAULT_RUN)
        except CheckpointError:
            return None
        checkpoint = str(DEFAULT_RUN)
    return Predictor.from_pretrained(checkpoint, device=device, max_pixels=MAX_PIXELS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Serve the vqa demo (Gradio).")
    p.add_argument("--checkpoint", default=None, metavar="RUN",
                   help=f"a run or checkpoint folder (default: {DEFAULT_RUN} if it holds one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=None, help="port (default 7860, or the next free one)")
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: CUDA, else MPS, else CPU)")
    p.add_argument("--concurrency", type=int, default=1, help="requests the model runs at once (default 1)")
    p.add_argument("--queue-size", type=int, default=16, help="requests that may wait (default 16)")
    args = p.parse_args(argv)
    try:
        pred = load_predictor(args.checkpoint, args.device)
    except VQAError as e:
        print(f"app.py: error: {e}", file=sys.stderr)
        return 2
    if pred is None:
        print(f"app.py: no checkpoint at {DEFAULT_RUN}; serving a page that explains how to train one "
              "(`make demo`)", file=sys.stderr)
    demo = build_app(pred)
    try:
        _, url, _ = serve(demo, args.host, args.port, args.concurrency, args.queue_size, block=False, quiet=True)
    except OSError as e:
        print(f"app.py: error: cannot listen on {args.host}:{args.port or 7860}: {e}", file=sys.stderr)
        return 2
    what = f"model {pred.path} on {pred.device}" if pred else "no model (how-to page)"
    print(f"vqa demo: serving {what} at {url} (Ctrl+C to stop)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
