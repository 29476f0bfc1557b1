"""The words of the Glyphs set: questions and captions about written characters.

Questions: every valid (question, answer) per family, from 2-3 templates each ("what colour is the letter
K?", "which character is red?", "does the picture show the digit 4?", "how many digits are there?", "does the
K come before the 3, reading left to right?", "are there more letters than digits?"); `generator` picks among
them so that answers stay balanced per question string. A glyph is named by its character ("the K", "the
letter K", "the ampersand"), its kind ("the digit") and / or its ink ("the red letter"); a name used as a
reference picks out exactly one glyph, and a colour question never names the colour, a character question never
the character. Answers: an ink colour, a character (letters and digits lower-cased as the tokenizer reads them,
a symbol by its name), yes / no, or a count 0-4. Captions: four per image; the first lists every glyph
reading left to right, so that every picture has a text that stops a horizontal flip (`--hflip`).
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import numpy as np

from .generator import FAMILIES, NUMBERS, article, by_count, comparisons, join, spatial, tally, unique_relations
from .glyphs_layout import CHARS, INKS, KINDS, MAX_GLYPHS, SYMBOLS

N_ANSWERS = {"attribute_color": len(INKS), "attribute_shape": len(CHARS), "count": MAX_GLYPHS + 1}  # others: yes/no
PLURAL = {"letter": "letters", "digit": "digits", "symbol": "symbols", None: "characters"}
# our relation -> the Shapes relation with the same meaning (the same 10% margin)
RELATIONS = {"before": "left of", "after": "right of", "above": "above", "below": "below"}
ON = {"grainy photo": "a grainy photo", "two-tone card": "a two-tone card"}  # "on paper", "on a grainy photo"


def answer(char: str) -> str:
    """A character as an answer: 'k', '7', 'ampersand'."""
    return SYMBOLS.get(char, char.lower())


def short(char: str) -> str:
    """'K', '7', 'ampersand'."""
    return SYMBOLS.get(char, char)


def long(char: str) -> str:
    """'letter K', 'digit 7', 'ampersand'."""
    return SYMBOLS[char] if char in SYMBOLS else f"{'digit' if char.isdigit() else 'letter'} {char}"


def name(colour: str | None, kind: str | None, char: str | None, full: bool = True) -> str:
    """'red letter K' / 'red K' (full=False), 'red letter', 'digit', 'red character'."""
    noun = (long(char) if full else short(char)) if char else (kind or "character")
    return f"{colour} {noun}" if colour else noun


def plural(colour: str | None, kind: str | None) -> str:
    return f"{colour} {PLURAL[kind]}" if colour else PLURAL[kind]


COLOUR_Q = ("what colour is the {long}?", "which colour is the {short}?", "the {short} is written in which colour?")
CHAR_Q = {  # by which attributes the glyph is named -> templates
    "colour": ("which character is {c}?", "what is written in {c}?"),
    "kind": ("which {k} is in the picture?", "what is the only {k}?"),
    "both": ("which {k} is {c}?", "what {k} is written in {c}?"),
}
EXIST_Q = ("is there {a}?", "does the picture show {a}?", "can you find {a}?")
COUNT_Q = ("how many {p} are there?", "how many {p} can you count?")
SPATIAL_Q = {
    "before": ("does the {a} come before the {b}, reading left to right?",
               "reading left to right, is the {a} before the {b}?"),
    "after": ("does the {a} come after the {b}, reading left to right?",
              "reading left to right, is the {a} after the {b}?"),
    "above": ("is the {a} written above the {b}?", "is the {a} higher on the page than the {b}?"),
    "below": ("is the {a} written below the {b}?", "is the {a} lower on the page than the {b}?"),
}
COMPARE_Q = (("are there more {} than {}?", ">"), ("are there fewer {} than {}?", "<"),
             ("are there as many {} as {}?", "="))
# every wording per family (spatial: one per form and relation), as `templates` matches a question back to it
TEMPLATES = {"attribute_color": COLOUR_Q, "attribute_shape": tuple(t for ts in CHAR_Q.values() for t in ts),
             "existence": EXIST_Q, "count": COUNT_Q,
             "spatial": tuple(SPATIAL_Q[rel][k] for k in range(2) for rel in RELATIONS),
             "comparison": tuple(t for t, _ in COMPARE_Q)}
# the words a slot holds: a glyph's name, with its article; "{k}" and "{c}" hold one kind, one ink
SLOT_WORDS = (*INKS, *KINDS, *PLURAL.values(), "character", *(short(c) for c in CHARS), "a", "an")
SLOTS = {"k": tuple(KINDS), "c": tuple(INKS)}

GROUPS = [(c, k) for c in (None, *INKS) for k in (None, *KINDS)]  # (ink, kind); (None, None) = every glyph
# existence: (ink, kind) or (None, None, char); an ink with a character ("a red K?") would be a "no" nearly
# always, and a string whose answer is nearly always one word is guessed from the question alone
DESCS = GROUPS[1:] + [(None, None, ch) for ch in CHARS]
PAIRS = [(x, y) for group in ([(None, k) for k in KINDS], [(c, None) for c in INKS])
         for x, y in product(group, repeat=2) if x != y]
# the wordings, made once (candidates() runs for every image)
EXISTS = {d: [t.format(a=article(name(*d) if len(d) == 3 else name(*d, None))) for t in EXIST_Q] for d in DESCS}
# counts: every glyph, one ink or one kind ("red digits" would be 0 or 1 nearly always: a guessable string)
COUNTS = {g: [t.format(p=plural(*g)) for t in COUNT_Q] for g in GROUPS if not all(g)}
COMPARES = {(x, y): [(t.format(plural(*x), plural(*y)), op) for t, op in COMPARE_Q] for x, y in PAIRS}


def _matches(objs: list[dict], colour: str | None, kind: str | None, char: str | None) -> list[dict]:
    return [o for o in objs if colour in (None, o["color"]) and kind in (None, o["kind"]) and char in (None, o["char"])]


def references(objs: list[dict], o: dict, use: str) -> list[tuple]:
    """(ink, kind, char) names that pick out glyph o and nothing else, with only the attributes `use` allows:
    "shape" (kind, char: for a colour question), "colour" (ink, kind: for a character question), "all"."""
    inks = (None, o["color"]) if use != "shape" else (None,)
    chars = (None, o["char"]) if use != "colour" else (None,)
    out = []
    for colour, kind, char in product(inks, (None, o["kind"]), chars):
        if char and kind:
            continue  # a character names its kind already
        if (colour or kind or char) and len(_matches(objs, colour, kind, char)) == 1:
            out.append((colour, kind, char))
    return out


def candidates(scene: dict, side: int, rng: np.random.Generator) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family for a scene (spatial: one random wording per glyph pair and
    relation)."""
    objs = scene["objects"]
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    for o in objs:
        for _, kind, char in references(objs, o, "shape"):
            cands["attribute_color"] += [(t.format(long=name(None, kind, char), short=name(None, kind, char, False)),
                                          o["color"]) for t in COLOUR_Q]
        for colour, kind, _ in references(objs, o, "colour"):
            how = "both" if colour and kind else "colour" if colour else "kind"
            cands["attribute_shape"] += [(t.format(c=colour, k=kind), answer(o["char"])) for t in CHAR_Q[how]]
    count = Counter((c, k) for o in objs for c in (None, o["color"]) for k in (None, o["kind"]))
    chars = Counter(o["char"] for o in objs)
    pick = iter(rng.integers(6, size=len(COUNTS) + len(DESCS) + len(PAIRS)).tolist())  # a template each
    for g in COUNTS:
        cands["count"].append((COUNTS[g][next(pick) % len(COUNT_Q)], str(count[g])))
    for d in DESCS:
        n = chars[d[2]] if len(d) == 3 else count[d]
        cands["existence"].append((EXISTS[d][next(pick) % len(EXIST_Q)], "yes" if n else "no"))
    names = [[name(*r, full=False) for r in references(objs, o, "all")] for o in objs]
    cands["spatial"] = spatial(objs, names, RELATIONS, side, rng,
                               lambda rel, a, b: SPATIAL_Q[rel][rng.integers(len(SPATIAL_Q[rel]))].format(a=a, b=b))
    cands["comparison"] = comparisons(COMPARES, count, pick)
    return cands


# ---------------------------------------------------------------------------------------------------------
# captions


def _listing(objs: list[dict]) -> str:
    """'a red K, a blue 3 and an orange ampersand'."""
    return join([article(f"{o['color']} {short(o['char'])}") for o in objs])


def _look(o: dict) -> str:
    """'an outlined, slanted', 'a bold, upright'."""
    lean = "upright" if abs(o["angle"]) < 8 else "slanted"
    return article(f"{o['style']}, {lean}")


CAPTION_REL = {"before": "comes before", "after": "comes after",
               "above": "is written above", "below": "is written below"}


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """Four captions: the glyphs reading left to right, a tally on the page, the glyphs top to bottom (one
    glyph: its look), and one clear relation (else the inks used)."""
    objs = sorted(scene["objects"], key=lambda o: o["x"])
    n, page = len(objs), scene["page"]
    kinds = (f"{NUMBERS[n]} character{'s' if n > 1 else ''} on {ON.get(page, page)}: "
             + tally((o["kind"] for o in objs), PLURAL.get))
    if n == 1:
        o = objs[0]
        return [f"reading left to right there is just one character: {_listing(objs)}", kinds,
                f"{_look(o)} {o['color']} {long(o['char'])}",
                f"the only thing written on the {page} is the {long(o['char'])}, in {o['color']}"]
    caps = [f"reading left to right: {_listing(objs)}", kinds,
            f"from top to bottom: {_listing(sorted(objs, key=lambda o: o['y']))}"]
    shorts = [f"{o['color']} {short(o['char'])}" for o in objs]
    pairs = unique_relations(objs, shorts, RELATIONS, side)
    if pairs:
        i, j, rel = pairs[rng.integers(len(pairs))]
        caps.append(f"the {shorts[i]} {CAPTION_REL[rel]} the {shorts[j]}")
    else:
        inks = by_count(o["color"] for o in objs)
        caps.append("characters close together: "
                    + join([f"{NUMBERS[k]} {c} one{'s' if k > 1 else ''}" for c, k in inks]))
    return caps


__all__ = ["N_ANSWERS", "answer", "candidates", "make_captions", "references"]
