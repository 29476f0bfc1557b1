"""The house's rule: the package's imports form layers without circles.

Every `import` statement of every module under vqa/ is read with `ast` (imports inside functions too: a lazy
import is still a dependency), resolved to the module it names, and checked against LAYERS: a module may
import its own layer and those listed before it, never one after. A cycle is an error even inside one layer.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "vqa"

# lowest first; a module belongs to the entry with the longest matching prefix
LAYERS = [
    ("vqa.errors", "vqa.json_object", "vqa.locks", "vqa.device", "vqa.distributed", "vqa.options", "vqa.logs",
     "vqa.cache_home", "vqa.identity"),
    ("vqa.config",),
    ("vqa.tokenizer",),
    ("vqa.model",),  # the architecture and what its training forward consumes (vqa.model.packed)
    ("vqa.weights",),  # files of weights, ours and other people's, read into and written from the architecture
    ("vqa.data",),  # builds that (vqa.data.packing), so it sits above the model
    ("vqa.decoding",),
    ("vqa.evaluation",),
    ("vqa.train",),
    ("vqa.inference",),
    ("vqa.export",),
    ("vqa.demo",),
    ("vqa.cli", "vqa"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The vqa modules `name` imports (a `from pkg import x` counts as pkg.x when x is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and (t == "vqa" or t.startswith("vqa.")):
                found.add(t)
    return found


def layer_of(name: str) -> int:
    best, layer = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{name} is in no layer: add it to LAYERS"
    return layer


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `g` as a path [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(g, WHITE)
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = GREY
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if color.get(m, BLACK) == GREY:
                return stack[stack.index(m):] + [m]
            if color.get(m) == WHITE and (c := visit(m)):
                return c
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(g):
        if color[n] == WHITE and (c := visit(n)):
            return c
    return None


def is_package_init_edge(a: str, b: str) -> bool:
    """A package's __init__ importing its own submodules (to re-export them) is not a dependency upward."""
    return b.startswith(a + ".")


def test_no_module_imports_a_higher_layer():
    wrong = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
             for a, deps in sorted(graph().items()) for b in sorted(deps)
             if layer_of(b) > layer_of(a)]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_import_cycles():
    g = {a: {b for b in deps if not is_package_init_edge(a, b)} for a, deps in graph().items()}
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer_and_stays_small():
    too_long = {}
    for name, path in all_modules().items():
        layer_of(name)
        n = len(path.read_text().splitlines())
        if n > 400:
            too_long[name] = n
    top = ROOT.parent  # the tests, the scripts and app.py keep to the same rule
    for path in [top / "app.py", *sorted((top / "tests").glob("*.py")), *sorted((top / "scripts").glob("*.py"))]:
        if path.is_file() and len(path.read_text().splitlines()) > 400:
            too_long[str(path.relative_to(top))] = len(path.read_text().splitlines())
    assert not too_long, f"files over 400 lines (split them by what they hold): {too_long}"


def test_the_checker_sees_a_cycle_and_a_layer_breach():
    # the rule's own check: a made-up graph with a cycle is caught, one without is not
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert layer_of("vqa.config") < layer_of("vqa.model.attention") < layer_of("vqa.demo.ask_tab")


def test_lazy_imports_count(tmp_path):
    # an import inside a function is a dependency like any other
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from vqa.demo import x\n")
    assert imports_of("vqa.config", p, {"vqa.demo": p, "vqa.config": p}) == {"vqa.demo"}


def test_the_decoding_methods_are_the_ones_the_config_lists_and_functions_of_the_decoding_layer():
    # the config (below vqa.decoding) lists the names for the CLI; generate's METHODS holds the functions, imported
    pytest.importorskip("torch")
    import inspect

    from vqa.config import DECODING_METHODS
    from vqa.decoding.generate import METHODS

    assert list(METHODS) == list(DECODING_METHODS)
    for name, function in METHODS.items():
        assert layer_of(function.__module__) == layer_of("vqa.decoding"), name
        assert list(inspect.signature(function).parameters) == ["decoder", "config"], name
    assert [name for name, entry in DECODING_METHODS.items() if entry.random] == ["sample"]
    assert [name for name, entry in DECODING_METHODS.items() if entry.ranked] == ["beam"]


def test_the_decoding_code_calls_its_functions_by_import_never_by_name():
    # go-to-definition follows every call of vqa/decoding: no function is looked up from a string
    found = [p.name for p in (ROOT / "decoding").rglob("*.py") if re.search(r"importlib|import_module|__import__",
                                                                          p.read_text())]
    assert not found
