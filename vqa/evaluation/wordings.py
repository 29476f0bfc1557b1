"""VQA accuracy per template, within each question type, for a split of a built-in set (Shapes, Scenes, Glyphs,
the corpus): which wordings a model fails ("compared with the B, is the A further left?" at chance while "is
the A further left than the B?" is not). The templates come from the questions' text
(`vqa.data.synthetic.templates`), so any folder of those sets has them, however old; other data has none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence


def template_scores(records: Sequence, per_question: Mapping) -> dict | None:
    """{"set": name, "per_family": {family: {template: {"accuracy", "questions"}}}}: the mean VQA accuracy (%,
    `per_question`'s, keyed by question id) of each template's questions, families sorted, templates in the
    set's order; None when the split is not all of one built-in set's questions."""
    from ..data.synthetic.templates import find_templates  # the sets' text tables: only where asked

    found = find_templates([(r.question_type, r.question) for r in records])
    if found is None:
        return None
    wordings, templates = found
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r, template in zip(records, templates, strict=True):
        scores[r.question_type][template].append(per_question[r.question_id])
    per_family = {
        family: {t: dict(accuracy=round(sum(v) / len(v), 2), questions=len(v))
                 for t in wordings.templates[family] if (v := scores[family].get(t))}
        for family in sorted(scores)}
    return {"set": wordings.name, "per_family": per_family}


def format_templates(t: dict) -> list[str]:
    """The breakdown's lines for `format_summary`: a family, then each template with its accuracy and count."""
    width = max(len(template) for rows in t["per_family"].values() for template in rows)
    lines = [f"  per template ({t['set']} wordings; accuracy, questions):"]
    for family, rows in t["per_family"].items():
        lines.append(f"    {family}")
        lines += [f"      {template:<{width}}  {r['accuracy']:6.2f}  {r['questions']:6d}"
                  for template, r in rows.items()]
    return lines


__all__ = ["format_templates", "template_scores"]
