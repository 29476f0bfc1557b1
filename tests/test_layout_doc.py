"""docs/layout.md names every module of vqa/ (but __init__.py and __main__.py), and each name it gives is a module.

The doc's block is a list of entries: a path at the start of a line (a folder, or a module of vqa/), then the
names it holds, over any indented lines that follow. Outside parentheses and backticks an entry holds only names:
a module of the entry's folder (`attention`, `logs.py`), a path from the repository's root (`vqa/options.py`), a
class or constant (capitalised, not checked), and `_suffix`, which names `<module>_suffix` for each module of the
entry (the synthetic sets' `_layout`, `_render`, `_text`). What a module holds goes in parentheses."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
SEPARATOR = re.compile(r"[\s,;+=]+")
SUFFIX = re.compile(r"(?<![\w/.])_[a-z][a-z0-9_]*")


def entries(text: str) -> list[tuple[str, str]]:
    """The block's entries under vqa/: (the path that starts it, its text over all its lines)."""
    found: list[list[str]] = []
    for line in text.split("```")[1].splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            path, _, rest = line.partition(" ")
            found.append([path, rest])
        elif found:
            found[-1][1] += " " + line.strip()
    return [(path, rest) for path, rest in found if path.startswith("vqa/")]


def outside_parentheses(text: str) -> str:
    text = re.sub(r"`[^`]*`", " ", text)
    while True:
        stripped = re.sub(r"\([^()]*\)", " ", text)
        if stripped == text:
            return text
        text = stripped


def read_layout(text: str) -> tuple[set[str], list[str]]:
    """The modules the doc names (paths from the root) and the names that are no module, as `entry: name`."""
    named, unknown = set(), []
    for path, rest in entries(text):
        folder = path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
        if not (ROOT / path).exists():
            unknown.append(f"{path}: {path}")
        elif not path.endswith("/"):
            named.add(path)
        stems = []
        for name in SEPARATOR.split(outside_parentheses(rest)):
            if name in ("", "/", "and") or name[0].isupper() or name.startswith("_"):
                continue
            module = name if "/" in name else folder + name.removesuffix(".py") + ".py"
            if (ROOT / module).is_file():
                named.add(module)
                stems.append(module.removesuffix(".py"))
            else:
                unknown.append(f"{path}: {name}")
        for suffix in set(SUFFIX.findall(rest)):
            hits = {stem + suffix + ".py" for stem in stems if (ROOT / (stem + suffix + ".py")).is_file()}
            named |= hits
            if not hits:
                unknown.append(f"{path}: {suffix}")
    return named, unknown


def vqa_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "vqa").rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}


def test_the_layout_names_every_module_and_only_modules():
    named, unknown = read_layout(LAYOUT.read_text())
    missing = sorted(vqa_modules() - named)
    assert not missing, f"docs/layout.md does not name these modules (add each with what it holds): {missing}"
    assert not unknown, f"docs/layout.md names what is no module (entry: name): {unknown}"


def test_a_removed_module_or_a_word_of_prose_is_reported():
    text = LAYOUT.read_text()
    named, unknown = read_layout(text.replace("masks (", "masks, sampler, what (", 1))
    assert unknown == ["vqa/model/: sampler", "vqa/model/: what"]
    assert "vqa/model/masks.py" in named and "vqa/data/synthetic/shapes_layout.py" in named
    assert "vqa/data/synthetic/glyphs_font.py" in named and "vqa/data/synthetic/shapes_font.py" not in named
