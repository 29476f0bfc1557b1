"""Transposed training images: x and y swapped, and the spatial phrases of their texts rewritten to match.

Why: Shapes' captions used to list objects left to right only, so a model learned horizontal order from every
caption and left / right questions with it, while nothing taught vertical order half as often: at step
3,200 of a run, "left of" / "right of" questions were 99% right and "above" / "below" ones at chance
(docs/shapes-10min.md, section 7). A transposed image turns each of those lessons into the vertical one.
Shapes now also lists the objects "from top to bottom", which a transposed image reads "from left to right".

Transposing maps (x, y) to (y, x): what was left of something is now above it, "on the left" is "at the top",
"at the top right" is "at the bottom left". The phrases below are the ones `vqa data shapes` writes (questions
say "left of", captions "to the left of"); an image whose texts hold any other spatial word ("upper",
"leftmost", "on top of", ...) or whose answer does, is never transposed, so other data sets lose nothing
but do not gain either.
"""

from __future__ import annotations

import re

# phrase -> the phrase it becomes, per kind of text (both directions; identities consume their words)
_PAIRS = {
    "question": [("left of", "above"), ("right of", "below")],
    "caption": [("to the left of", "above"), ("to the right of", "below"), ("on the left", "at the top"),
                ("on the right", "at the bottom"), ("at the top right", "at the bottom left"),
                ("at the top left", "at the top left"), ("at the bottom right", "at the bottom right"),
                ("from top to bottom", "from left to right")],
}
SPATIAL_WORD = re.compile(
    r"\b(left|right|top|bottom|above|below|up|down|upper|lower|over|under|beneath|underneath|behind|front|"
    r"vertical\w*|horizontal\w*|leftmost|rightmost|topmost|bottommost|north|south|east|west)\b", re.IGNORECASE)


def _table(kind: str) -> tuple[re.Pattern, dict[str, str]]:
    swap: dict[str, str] = {}
    for a, b in _PAIRS[kind]:
        swap[a], swap[b] = b, a
    phrases = sorted(swap, key=len, reverse=True)  # "to the left of" before "left of", "at the top left" first
    return re.compile(r"\b(" + "|".join(map(re.escape, phrases)) + r")\b"), swap


_TABLES = {kind: _table(kind) for kind in _PAIRS}


def transpose_text(text: str, kind: str) -> str | None:
    """`text` (a "question" or "caption") as it reads for the transposed image, or None when it has a
    spatial word the rewriting does not know."""
    pattern, swap = _TABLES[kind]
    parts = pattern.split(text)  # odd items: the known phrases
    if any(SPATIAL_WORD.search(p) for p in parts[0::2]):
        return None
    return "".join(swap[p] if i % 2 else p for i, p in enumerate(parts))


def is_spatial(text: str) -> bool:
    """True if `text` (e.g. an answer) uses a spatial word: such a text cannot follow a transposition."""
    return bool(SPATIAL_WORD.search(text or ""))


__all__ = ["transpose_text", "is_spatial"]
