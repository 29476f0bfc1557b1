"""The demo's model card and its familiarity check.

`card_markdown(pred)` is the Model card tab: what was loaded, how big it is, what it was trained on and how
it scored; `training_data(card)` says in words what the model was trained on (and finds that folder when it
is on this machine); `start_reference(server, pred, "auto")` gives the batching layer a `Familiarity`
reference built from those training pictures, so unusual pictures get a warning with their answer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import VQAError

REFERENCE_PICTURES = 256  # training pictures the familiarity check compares with


def training_data(card: dict) -> tuple[str, Path | None]:
    """What the card says the model was trained on, in words, and that data folder if it is on this
    machine (for the familiarity check)."""
    data = card.get("data")
    if not data:
        return "not recorded in the checkpoint's card", None
    folder = Path(str(data))
    split = card.get("train_split") or "train"
    here = folder if folder.is_dir() else None
    for name in ("shapes", "scenes", "glyphs"):
        if (folder / f"{name}_info.json").is_file() or (here is None and folder.name == name):
            pictures, asked = _built_in(name)
            return (f"the built-in **{name.title()}** set (`{data}`, split {split}): synthetic 64 px {pictures}, with "
                    f"questions about colour, {asked}, existence, counting, position and comparison. It has seen "
                    "nothing else: about photographs or other drawings its answers are guesses"), here
    return f"`{data}` (split {split})", here


def _built_in(name: str) -> tuple[str, str]:
    """A built-in set's pictures in words, and what its questions ask beside colour."""
    if name == "shapes":
        from ..data.synthetic import shapes_layout as scene

        return (f"scenes of 1 to 6 flat objects ({', '.join(scene.SHAPES)}; {len(scene.COLORS)} colours, 2 sizes) on "
                "grey backgrounds"), "shape"
    if name == "scenes":
        from ..data.synthetic import scenes_layout as scene

        return (f"scenes of 1 to 6 outlined objects ({', '.join(scene.KINDS)}; {len(scene.COLOURS)} colours) on "
                "patterned backgrounds"), "kind"
    from ..data.synthetic import glyphs_layout as scene

    return (f"pictures of 1 to 4 written characters (A-Z, 0-9, {', '.join(scene.SYMBOLS)}; {len(scene.INKS)} inks, "
            "Pillow's built-in font) on paper-like pages"), "character"


def vit_kind(cfg) -> str:
    """The ViT in words: timm's named model, or one built from its code at other sizes (tiny: 3 layers, 96 wide)."""
    if cfg.vit_width or cfg.vit_depth:
        return f"a ViT of its own size, built with timm's {cfg.vit_name} code"
    return f"timm's {cfg.vit_name}"


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
        ("identity", f"`{pred.identity}`" if pred.identity else "in memory (no files)"),
        ("preset", c.get("preset", "?")),
        ("parameters", f"{pred.model.num_parameters():,}"),
        ("image encoder", f"{vit_kind(cfg)}, {cfg.vit_image_size} px in {cfg.vit_patch_size} px patches"
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
    rows = score_rows(c.get("val_scores") or {})
    if rows:
        lines += ["", f"**Scores on {c.get('val_split', 'val')}**", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in rows]
        if any(k.startswith("CIDEr-D") for k, _ in rows):
            lines += ["", "Scores are on a 0-100 scale. CIDEr-D, how much of each caption's wording the reference "
                          "captions share (rarer words count more), runs from 0 to 10 and is shown x100 as papers "
                          "print it: 100 is a caption as close to the references as they are to each other, on "
                          "average."]
    return "\n".join(lines)


SCORE_NAMES = {"vqa_accuracy": "VQA accuracy", "per_answer_type": "VQA accuracy, answers of type",
               "per_question_type": "VQA accuracy, questions of type", "images": "images scored",
               "questions": "questions scored", "seconds": "scoring time", "scoring": "answers scored by",
               "decoding": "decoding of"}


def score_rows(scores: dict) -> list[tuple[str, str]]:
    """The card's score table: names in words, every score on one 0-100 scale with one decimal (VQA accuracy is
    a percentage already; BLEU and CIDEr-D are multiplied by 100, as papers print them)."""
    rows = []
    for key, value in scores.items():
        name = SCORE_NAMES.get(key, key)
        if isinstance(value, dict):
            rows += [(f"{name} \"{sub}\"", f"{v:.1f}%") for sub, v in value.items() if isinstance(v, int | float)]
            words = {"vqa": "answers", "caption": "captions"}  # the decoding of each task
            rows += [(f"{name} {words.get(sub, sub)}", v) for sub, v in value.items() if isinstance(v, str)]
        elif key in ("images", "questions"):
            rows.append((name, f"{value:,}"))
        elif key == "seconds":
            rows.append((name, f"{value:.0f} s"))
        elif key.startswith(("BLEU", "CIDEr")):
            rows.append((name, f"{100 * value:.1f}"))
        elif isinstance(value, float):
            rows.append((name, f"{value:.1f}%" if key == "vqa_accuracy" else f"{value:.1f}"))
        else:
            rows.append((name, str(value)))
    return rows


def start_reference(server, pred, reference: Any) -> str:
    """Give `server` its familiarity reference: a `Familiarity`, None (no check) or "auto" (built now from up
    to REFERENCE_PICTURES training pictures named in the card, when that folder is on this machine: a few
    seconds at start-up for the tiny model). Returns the model card's sentence about the check."""
    if reference is None:
        return ""
    if reference == "auto":
        from .familiarity import Familiarity

        _, folder = training_data(pred.card)
        if folder is None:
            data = pred.card.get("data")
            return (f"The training pictures (`{data}`) are not on this machine, so pictures cannot be compared "
                    "with them: no warning is given for unusual pictures.") if data else ""
        try:
            reference = Familiarity.from_data(pred, folder, pred.card.get("train_split") or "train",
                                              n=REFERENCE_PICTURES)
        except (VQAError, OSError) as e:
            print(f"vqa demo: no familiarity check: {e}", file=sys.stderr)
            return f"The training pictures could not be read ({e}): no warning is given for unusual pictures."
    server.familiarity = reference
    return (f"Each picture is compared with {reference.source or 'reference pictures'} in the model's own "
            "features (`vqa.demo.familiarity`); one unlike all of them gets a warning with its answer.")
