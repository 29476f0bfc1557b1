"""The Ask, Caption and Find tabs' handlers, callable without a Gradio server.

`Handlers(pred, server)` holds a `vqa.Predictor` and the batching layer in front of it
(`vqa.inference.serving.SharedPredictor`); its methods take the page's inputs and return its outputs:

    h = Handlers(pred, SharedPredictor(pred, attention=True))
    answer, top_answers, word_radio, note, state = h.ask("photo.png", "what color is it?", 3, None)
    text, details, word_radio, state = h.caption("photo.png", "greedy", *control_values, None)
    picture = h.heatmap(0, MEAN, MEAN, state)            # where the model looked for word 0
    picture, line = Finder(pred).find("photo.png", "the red star")   # the Find tab's /point

`streamed_ask` / `streamed_caption` are /ask and /caption as generators: the text as it is decoded
(`vqa.inference.streaming.run_streamed`, through the batch's `on_tokens` hook), then the same outputs, so
streaming changes no result and requests still share batched calls; a page that leaves stops reading while
its batch finishes for the others.

Bad input (no picture, an empty question, an unreadable or oversized picture, a decoding setting or top-k
outside the bounds its control shows, which an API caller is held to as well) raises a `gr.Error` with the message the
page shows. `state` is the user's last answer or caption (its words and attention maps, the upload, the result), which
the heatmap and the attention explorer read.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, ImageDraw

from ..config import DECODING_METHODS, GenerationConfig
from ..config.generation import in_range
from ..errors import ConfigError, VQAError
from ..inference.pointing import Point, object_words
from ..inference.serving import Busy
from ..inference.streaming import run_streamed
from .uploads import DECODING, DecodeBudget, decoded_bytes, fail

MAX_QUESTION_CHARS = 1000  # longer questions are cut here, then to the model's context by the tokenizer
DISPLAY_SIDE = 480  # heatmaps are drawn on a copy of the picture this big (longer side)
DISPLAY_QUALITY = 90  # a user keeps its display copy as a JPEG of this quality, a fraction of its raw pixels
MEAN = -1  # the layer / head selector value meaning "average them all"
NO_PICTURE = "Please upload a picture or pick an example first."
MARK = (255, 0, 255)  # the Find tab's marks, magenta: rare in photos and in the Shapes / Scenes colours


def busy(e: Exception) -> gr.Error:
    return gr.Error(str(e), title="Busy", print_exception=False)


def no_picture() -> gr.Error:
    return gr.Error(NO_PICTURE, title="No picture", print_exception=False)


@contextmanager
def page_errors(image: Any, also: tuple = ()) -> Iterator[None]:
    """Busy, a VQAError and the `also` exceptions as the page's message about `image` (without server paths)."""
    try:
        yield
    except Busy as e:
        raise busy(e) from None
    except (VQAError, *also) as e:
        raise fail(e, image) from None


def check_question(question: Any) -> tuple[str, list[str]]:
    """The question to ask (cut to MAX_QUESTION_CHARS) and the notes about it; an empty one: a gr.Error."""
    notes = []
    if not isinstance(question, str) or not question.strip():
        raise gr.Error("Please type a question about the picture.", title="The question is empty",
                       print_exception=False)
    if len(question) > MAX_QUESTION_CHARS:
        question = question[:MAX_QUESTION_CHARS]
        notes.append(f"The question was cut to its first {MAX_QUESTION_CHARS} characters.")
    return question, notes


def display_copy(img: Image.Image) -> Image.Image:
    """The picture scaled (up or down) so its longer side is DISPLAY_SIDE, to draw heatmaps on."""
    scale = DISPLAY_SIDE / max(img.size)
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    return img.resize(size, Image.Resampling.BICUBIC)


def word_radio(words: list[str]) -> gr.Radio:
    """The word selector of a new answer or caption, its first word chosen."""
    return gr.Radio(choices=[(f"{i + 1}. {w}", i) for i, w in enumerate(words)], value=0 if words else None)


def display_image(pred, state: dict, budget: DecodeBudget = DECODING) -> Image.Image:
    """The user's display copy of its picture, made on first use (the answer does not wait for it) and
    kept in `state` as JPEG bytes, the one copy a user's state holds; the decoded upload is held within `budget`."""
    if state.get("image") is None:
        with budget.hold(decoded_bytes(state["source"])):
            copy = display_copy(pred.load(state["source"]))
        buffer = io.BytesIO()
        copy.save(buffer, format="JPEG", quality=DISPLAY_QUALITY)
        state["image"] = buffer.getvalue()  # and drawn from it every time, the first included: the same pixels
    copy = Image.open(io.BytesIO(state["image"]))
    copy.load()
    return copy


def draw_heatmap(pred, state: dict | None, word: Any, layer: Any, head: Any,
                 budget: DecodeBudget = DECODING) -> Image.Image | None:
    """Where the model looked while writing word `word` of the user's last result (None: nothing yet)."""
    from ..inference.heatmaps import attention_heatmap

    if not state or not state.get("words"):
        return None
    i = int(word) if word is not None and 0 <= int(word) < len(state["words"]) else 0
    layer = None if layer is None or int(layer) == MEAN else int(layer)
    head = None if head is None or int(head) == MEAN else int(head)
    return attention_heatmap(display_image(pred, state, budget), state["maps"][i], layer=layer, head=head,
                             image_size=pred.cfg.vit_image_size, resize=pred.cfg.vit_resize)


def state_from(source: Any, result) -> dict:
    """What a user's page keeps of its last answer or caption: the words and their maps, and what the heatmap and
    the explorer need (the upload's path, the result; the display copy is made when first drawn)."""
    words = result.words()
    maps = np.stack([m.numpy() for _, m in words]) if words else np.zeros((0,))
    return dict(image=None, words=[w for w, _ in words], maps=maps, source=source, result=result)


def unfamiliar_note(ratio: float | None) -> list[str]:
    if ratio is None or ratio <= 1.0:
        return []
    return ["**This picture looks unlike the pictures the model was trained on** (see the model card): "
            "its answers are only meaningful for pictures like those, so take this one as a guess."]


def ui_fields() -> list:
    """GenerationConfig's fields that the app shows (those with `ui` metadata), in their order."""
    return [f for f in dataclasses.fields(GenerationConfig) if f.metadata.get("ui")]


def decoding_settings(method: Any, values: Any) -> GenerationConfig:
    """The GenerationConfig of the caption tab's controls (an empty number box: None), each value checked
    against the bounds its control shows (`GenerationConfig.ui_value`): a ConfigError naming the field."""
    changes = {"method": str(method)}
    values = list(values)
    if len(values) != len(ui_fields()):
        raise ConfigError(f"expected {len(ui_fields())} decoding settings "
                          f"({', '.join(f.name for f in ui_fields())}), got {len(values)}")
    for f, v in zip(ui_fields(), values, strict=True):
        changes[f.name] = None if v is None or v == "" else GenerationConfig.ui_value(f.name, v)
    return GenerationConfig.for_task("caption", **changes)


def answers_to_list(top_k: Any) -> int:
    """The Ask tab's top-k as an int within its slider's bounds: those of num_beams, since the answers listed
    are beams (`Predictor.answer_settings`); a gr.Error naming the control otherwise."""
    try:
        return in_range("top_k (answers to list)", top_k, *GenerationConfig.ui_bounds("num_beams"), integer=True)
    except ConfigError as e:
        raise gr.Error(str(e), title="Bad setting", print_exception=False) from None


def _hook(on_tokens) -> dict:
    """The streaming hook as a keyword, or nothing: a server without streaming is called as before."""
    return {} if on_tokens is None else dict(on_tokens=on_tokens)


class Handlers:
    """The Ask tab's `ask`, the Caption tab's `caption` and the heatmap's `heatmap`, around `pred` (a
    `vqa.Predictor`) and `server` (its `SharedPredictor`, built with attention=True). Each upload becomes
    the model's input in the request's thread (`Predictor.model_input`, training's preprocessing) while its
    decoded picture is held within `budget` (the bytes of decoded pictures all requests may hold at once: a
    request waits for room, then is told the demo is busy)."""

    def __init__(self, pred, server, budget: DecodeBudget = DECODING):
        self.pred, self.server, self.budget = pred, server, budget

    def ask(self, image, question, top_k, state, on_tokens=None):
        """(answer, {answer: probability}, the word selector, notes in markdown, the new state). `on_tokens`:
        the batch's streaming hook (`SharedPredictor.answer`; `streamed_ask`)."""
        pred = self.pred
        if image is None:
            raise no_picture()
        question, notes = check_question(question)
        top_k = answers_to_list(top_k)
        with page_errors(image):
            res, ratio = self.server.answer(self._pixels(image), question, top_k, **_hook(on_tokens))
            state = state_from(image, res)
        notes += unfamiliar_note(ratio)
        if res.truncated:
            notes.append("The question was too long for the model: only its first "
                         f"{pred.tokenizer.max_question_tokens(pred.cfg.dec_max_len)} tokens were read.")
        if pred.tokenizer.unk_id in pred.tokenizer.encode(question):
            notes.append("Some characters (emoji, or a script the model never saw) are unknown to this model "
                         "and were read as `<unk>`.")
        label = {a or "(empty)": p for a, p in res.top_k}
        return res.answer, label, word_radio(state["words"]), "\n\n".join(notes), state

    def caption(self, image, method, *values, on_tokens=None):
        """`values`: the decoding controls (GenerationConfig's `ui` fields, in order), then the state.
        Returns (caption, details in markdown, the word selector, the new state); `on_tokens`: as `ask`'s."""
        *values, state = values
        if image is None:
            raise no_picture()
        try:
            settings = decoding_settings(method, values)
        except (ConfigError, TypeError, ValueError) as e:
            raise gr.Error(f"Bad decoding setting: {e}", title="Bad setting", print_exception=False) from None
        with page_errors(image):
            res, ratio = self.server.caption(self._pixels(image), settings, **_hook(on_tokens))
            state = state_from(image, res)
        if res.beams:
            details = "\n".join(f"{i}. {c or '(empty)'} — log-prob {s:.2f}" for i, (c, s) in enumerate(res.beams, 1))
        else:
            details = f"log-prob {res.log_prob:.2f} ({settings.method}" + (
                f", seed {settings.seed})" if DECODING_METHODS[settings.method].random else ")")
        details = "\n\n".join([details, *unfamiliar_note(ratio)])
        return res.caption, details, word_radio(state["words"]), state

    def heatmap(self, word, layer, head, state):
        """The heatmap of word `word` (its index) in decoder layer `layer` and head `head` (MEAN: all)."""
        with page_errors((state or {}).get("source"), (ValueError, TypeError, IndexError)):
            return draw_heatmap(self.pred, state, word, layer, head, self.budget)

    def streamed_ask(self, image, question, top_k, state):
        """/ask as a generator: the answer as it is decoded, then `ask`'s outputs."""
        yield from self._streamed(lambda hook: self.ask(image, question, top_k, state, on_tokens=hook), 4)

    def streamed_caption(self, image, method, *values):
        """/caption as a generator: the caption as it is decoded, then `caption`'s outputs."""
        yield from self._streamed(lambda hook: self.caption(image, method, *values, on_tokens=hook), 3)

    def _streamed(self, call, skipped: int):
        """(text so far, `skipped` x gr.skip()) as the tokens come, then `call(hook)`'s own outputs."""
        outputs, _ = yield from run_streamed(call, self.pred.tokenizer.decode,
                                             lambda text: (text, *[gr.skip()] * skipped), stop_early=False)
        yield outputs

    def _pixels(self, image):
        """The model's input of `image`; its decoded picture is held within the budget until then."""
        with self.budget.hold(decoded_bytes(image)):
            return self.pred.model_input(image)


# ------------------------------------------------------------------------------------------- the Find tab


def mark_sizes(size: tuple[int, int]) -> tuple[int, int]:
    """(line width, ring radius) in pixels for a picture of `size`: visible at any size once scaled to fit."""
    side = max(size)
    return max(2, round(side / 160)), max(4, round(side / 40))


def marked(picture: Image.Image, found: Point) -> Image.Image:
    """A copy of `picture` with `found` drawn on it (its box's outline, a ring at its point); unmarked when
    the model says there is none."""
    out = picture.copy()
    if not found.found:
        return out
    width, radius = mark_sizes(out.size)
    left, top, right, bottom = (round(v) for v in found.box)
    draw = ImageDraw.Draw(out)
    draw.rectangle((left, top, max(left, right - 1), max(top, bottom - 1)), outline=MARK, width=width)
    x, y = found.point
    draw.ellipse((x - radius, y - radius, x + radius, y + radius), outline=MARK, width=width)
    return out


def found_line(found: Point) -> str:
    """What the page says of `found`, in markdown."""
    if not found.found:
        return (f"The model says there is no {object_words(found.phrase)} (its probability that there is one: "
                f"{found.exists:.0%}).")
    (x, y), (left, top, right, bottom) = found.point, found.box
    return (f"**{object_words(found.phrase)}**: found at ({x:.0f}, {y:.0f}), in the box ({left:.0f}, {top:.0f}) to "
            f"({right:.0f}, {bottom:.0f}), in the picture's pixels. The model's colour for it: {found.colour}.")


def check_object(phrase: Any) -> str:
    """The object to find, cut to MAX_QUESTION_CHARS; none named: a gr.Error."""
    if not isinstance(phrase, str) or not phrase.strip() or not object_words(phrase):
        raise gr.Error('Please name the object to find, e.g. "the red circle".', title="Nothing to find",
                       print_exception=False)
    return phrase[:MAX_QUESTION_CHARS]


class Finder:
    """The Find tab's `find` around `pred` (a `vqa.Predictor`): where the model says a named object is
    (`Predictor.point`), marked on a copy of the user's picture in its own pixels (the box's outline, a ring at
    the point), or that it says there is none (unmarked). The upload is held within `budget` until drawn on."""

    def __init__(self, pred, budget: DecodeBudget = DECODING):
        self.pred, self.budget = pred, budget

    def find(self, image: Any, phrase: Any) -> tuple[Image.Image, str]:
        """(the picture marked where the model says `phrase` is, the line that says so)."""
        if image is None:
            raise no_picture()
        phrase = check_object(phrase)
        with page_errors(image), self.budget.hold(decoded_bytes(image)):
            picture = self.pred.load(image)
            found = self.pred.point(picture, phrase)
            return marked(picture, found), found_line(found)
