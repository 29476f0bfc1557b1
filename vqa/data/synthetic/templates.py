"""Which template of a built-in set (Shapes, Scenes, Glyphs, the corpus) a question was written from, found from
its text alone, so that a folder built before anyone asked gets its questions' wordings too.

Each set's `_text` module lists its templates per family (`TEMPLATES`: the strings `candidates` fills in, the
spatial ones with their relation written out) and the words a slot may hold (`SLOT_WORDS`, `SLOTS` per slot
name). A template becomes a regex: its literal text, each slot a run of those words. A question has a template
when exactly one of its family's templates matches it; a split has templates when one set has a template for
every question (a folder of one's own, or a mix, has none). The sets' tests match every generated question.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cached_property
from types import ModuleType

from . import corpus_text, glyphs_text, scenes_text, shapes_text

SLOT = re.compile(r"\{(\w*)\}")


def _words(words: Iterable[str]) -> str:
    """A regex for one or more of `words`, one space apart (longest first, so "question mark" beats "a")."""
    alt = "|".join(re.escape(w) for w in sorted(set(words), key=lambda w: (-len(w), w)))
    return rf"(?:{alt})(?: (?:{alt}))*"


class Wordings:
    """One set's templates, compiled: `template(family, question)` is the template that wrote the question."""

    def __init__(self, name: str, text: ModuleType):
        self.name, self.templates, self.text = name, text.TEMPLATES, text

    @cached_property
    def patterns(self) -> dict[str, list[tuple[str, re.Pattern]]]:
        """{family: [(template, its regex)]}, compiled at first use (not at every import of `vqa eval`'s code)."""
        slots = {name: _words(words) for name, words in getattr(self.text, "SLOTS", {}).items()}
        default = _words(self.text.SLOT_WORDS)
        return {family: [(t, re.compile("".join(re.escape(part) if k % 2 == 0 else slots.get(part, default)
                                                for k, part in enumerate(SLOT.split(t)))))
                         for t in templates]
                for family, templates in self.templates.items()}

    def matches(self, family: str, question: str) -> list[str]:
        """Every template of `family` that fits the question (more than one: it is ambiguous)."""
        return [t for t, pattern in self.patterns.get(family, ()) if pattern.fullmatch(question)]

    def template(self, family: str, question: str) -> str | None:
        found = self.matches(family, question)
        return found[0] if len(found) == 1 else None


SETS = (Wordings("Shapes", shapes_text), Wordings("Scenes", scenes_text), Wordings("Glyphs", glyphs_text),
        Wordings("Corpus", corpus_text))


def find_templates(questions: Sequence[tuple[str, str]]) -> tuple[Wordings, list[str]] | None:
    """(the set, each question's template) for the first set with a template for every (family, question);
    None when no set has (an empty list included)."""
    if not questions:
        return None
    for wordings in SETS:
        seen: dict[tuple[str, str], str | None] = {}  # a split repeats its question strings
        out = []
        for key in questions:
            if key not in seen:
                seen[key] = wordings.template(*key)
            if seen[key] is None:
                break
            out.append(seen[key])
        else:
            return wordings, out
    return None


__all__ = ["SETS", "Wordings", "find_templates"]
