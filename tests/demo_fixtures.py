"""What the demo's handler tests share: the gr.Error a handler raises (the fixtures `pred`, `handlers` and
`pictures` are in conftest.py)."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[dev]')")


def error(fn, *args) -> gr.Error:
    with pytest.raises(gr.Error) as err:
        fn(*args)
    return err.value
