"""The demo's attention explorer called directly (`vqa.demo.explorer`): it explains the last answer and exports
it, refuses a token, layer, head or patch that does not exist, keeps only a handle per user with a few
explanations shared, and leaves a bounded number of export folders."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from demo_fixtures import error as _error
from PIL import Image
from predict_fixtures import COLOR_Q, DEMO_WARNINGS

gr = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[dev]')")

from vqa.demo import handlers as h  # noqa: E402
from vqa.demo.explorer import EMPTY_HINT, Explorer  # noqa: E402

pytestmark = DEMO_WARNINGS


def test_the_explorer_handlers_explain_the_last_answer_and_export_it(handlers, pred, pictures, tmp_path):
    ex = Explorer(pred)
    empty = ex.explain(None)  # before any question: a hint, no pictures
    assert empty[0] is None and empty[6] == EMPTY_HINT and empty[7:11] == (None, None, None, None)
    for redraw, args in ((ex.redraw_self, (0, 0, h.MEAN)), (ex.redraw_patch, (1, 1)), (ex.export, (0, 0, 0, 1, 1))):
        assert "Nothing to explain" in _error(redraw, None, *args).title
    *_, state = handlers.ask(str(pictures["blue_square"]), COLOR_Q, 3, None)
    e, token, layer, head, row, col, info, *views, cross = ex.explain(state)
    assert '"what color is the shape?" → "blue"' in info and ex.explanation(e).text == "blue"
    assert token.value == 0 and head.value == h.MEAN and layer.value == pred.cfg.dec_depth - 1
    assert cross.value == pred.cfg.cross_layers - 1
    assert 1 <= row.value <= pred.grid and 1 <= col.value <= pred.grid
    assert all(isinstance(v, Image.Image) and v.width > 300 for v in views)
    self_img, qk = ex.redraw_self(e, 0, 0, 1)
    assert self_img.size != views[0].size or self_img.tobytes() != views[0].tobytes()
    cross, qk, vit, r, c = ex.redraw_token(e, 0, 0, h.MEAN)
    assert isinstance(cross, Image.Image) and (r.value, c.value) == (row.value, col.value)
    assert isinstance(ex.redraw_patch(e, 1, 1), Image.Image)
    names = sorted(os.path.basename(f) for f in ex.export(e, 0, layer.value, h.MEAN, row.value, col.value))
    assert "attention.npz" in names and any(n.startswith("cross_attention_01_blue") for n in names)
    # values no control offers (an API caller's): a message naming the problem, never a bare IndexError
    for fn, args in ((ex.redraw_self, (e, 0, 10**6, h.MEAN)), (ex.redraw_self, (e, 0, 0, 99)),
                     (ex.redraw_token, (e, 99, 0, h.MEAN)), (ex.redraw_patch, (e, 10**6, 1)),
                     (ex.redraw_patch, (e, float("nan"), 1)), (ex.export, (e, 0, 99, h.MEAN, 1, 1))):
        err = _error(fn, *args)
        assert err.title == "Cannot do that" and err.message, (fn.__name__, args)


def test_the_explorer_refuses_a_token_layer_head_or_patch_that_does_not_exist(handlers, pred, pictures):
    """An API caller's 0 or negative row, column, token, layer or head is refused, naming the control and its
    range: Python's negative indexing would otherwise show another patch, token or layer than the one asked."""
    ex = Explorer(pred)
    *_, state = handlers.ask(str(pictures["blue_square"]), COLOR_Q, 3, None)
    e = ex.explain(state)[0]
    g, layers, heads = pred.grid, pred.cfg.dec_depth, pred.cfg.dec_heads
    for fn, args, named in (
            (ex.redraw_patch, (e, 0, 1), f"patch row must be a whole number from 1 to {g}, got 0"),
            (ex.redraw_patch, (e, 1, -1), f"patch column must be a whole number from 1 to {g}, got -1"),
            (ex.redraw_patch, (e, g + 1, 1), "patch row"),
            (ex.redraw_token, (e, -1, 0, h.MEAN), "token must be a whole number from 0 to 0, got -1"),
            (ex.redraw_self, (e, 0, -1, h.MEAN), f"layer must be a whole number from 0 to {layers - 1}, got -1"),
            (ex.redraw_self, (e, 0, 0, -2), f"head ({h.MEAN}: every head) must be a whole number from 0 to "
                                            f"{heads - 1}, got -2"),
            (ex.export, (e, 0, 0, h.MEAN, 0, 1), "patch row"),
            (ex.export, (e, -1, 0, h.MEAN, 1, 1), "token")):
        err = _error(fn, *args)
        assert err.title == "Cannot do that" and named in err.message, (fn.__name__, args, err.message)
    assert isinstance(ex.redraw_patch(e, g, g), Image.Image)  # the last patch is there


def test_users_share_a_few_explanations_and_keep_only_a_handle(handlers, pred, pictures):
    """A user's explorer state is a handle (its answer, upload and display copy), never the Explanation
    (~20 MiB with the small model): the explorer keeps the last few for all users, and one dropped is built
    again, the same, when its user draws again."""
    import pickle

    from vqa.demo.explorer import Explained
    from vqa.inference.figures import top_patch

    ex = Explorer(pred, explanations=2)
    users = []
    for name in ("blue_square", "red_circle", "blue_square"):
        *_, state = handlers.ask(str(pictures[name]), COLOR_Q, 3, None)
        handle, *_, vit, _cross = ex.explain(state)
        assert isinstance(handle, Explained) and len(pickle.dumps(handle.state)) < 100_000
        users.append((handle, vit))
    assert len(ex._recent) == 2 and users[0][0] not in ex._recent  # the first user's was dropped
    first, vit = users[0]
    r, c = top_patch(ex.explanation(first), 0)  # built again, on first use: the patch explain showed
    again = ex.redraw_patch(first, r + 1, c + 1)
    assert again.tobytes() == vit.tobytes() and first in ex._recent and len(ex._recent) == 2


class _SavedExplanation:
    """Stands in for an Explanation: its save writes one file per call, as fast as can be."""

    generated = ["blue"]
    self_weights = np.zeros((1, 1, 2, 2))  # [L, H, T, T]: one layer, one head
    cross_weights = np.zeros((1, 1, 2, 1))  # [Lc, H, T, N]
    grid = 1

    def save(self, folder, **_):
        path = folder / "attention.npz"
        path.write_bytes(b"x" * 1000)
        return [path]


def test_exports_leave_a_bounded_number_of_folders(monkeypatch, tmp_path):
    """Each export wrote a new vqa-attention-* folder that was never removed (gradio serves its own cached
    copy, cleaned by delete_cache): a server filled its temporary folder. Only the last few are kept, and
    those go when the explorer does."""
    import gc

    from vqa.demo.explorer import EXPORTS_KEPT

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the exports land here, to be counted
    ex, e = Explorer(None), _SavedExplanation()
    for n in range(1, 3 * EXPORTS_KEPT + 1):
        files = ex.export(e, 0, 0, h.MEAN, 1, 1)
        folders = list(tmp_path.glob("vqa-attention-*"))
        assert len(folders) == min(n, EXPORTS_KEPT)
        assert all(os.path.isfile(f) for f in files)  # the newest export is there to be served
    small = Explorer(None, keep=2)
    for _ in range(5):
        small.export(e, 0, 0, h.MEAN, 1, 1)
    assert len(list(tmp_path.glob("vqa-attention-*"))) == EXPORTS_KEPT + 2
    del ex, small
    gc.collect()
    assert list(tmp_path.glob("vqa-attention-*")) == []  # an explorer that goes takes its exports along

    class Failing(_SavedExplanation):
        def save(self, folder, **_):
            raise OSError("disk full")

    with pytest.raises(OSError):
        Explorer(None).export(Failing(), 0, 0, h.MEAN, 1, 1)
    assert list(tmp_path.glob("vqa-attention-*")) == []  # a failed export leaves nothing behind


def test_a_llama_layout_model_gets_each_view_its_own_layers_by_the_language_models_number(tmp_path, pictures):
    """The llama layout (SmolLM2's presets) has a cross-attention block before every dec_cross_every-th layer:
    here 2 of 3. The self-attention view offers the 3 layers, the query/keys view the 2 cross-attention layers,
    named by the decoder layer they belong to (1 and 3); each is reached, none is shown for another."""
    import torch
    from llama_fixtures import save_tiny_llama
    from lm_fixtures import VIT

    from vqa.demo.explorer import build_tab, cross_choices
    from vqa.inference.predict import Predictor
    from vqa.tokenizer import Tokenizer
    from vqa.weights.language_model import build_model, model_preset

    folder = save_tiny_llama(tmp_path / "lm", "smollm2")
    torch.manual_seed(0)
    model = build_model(model_preset("tiny", dec_pretrained=str(folder), dec_max_len=64, dec_cross_every=2, **VIT))
    pred = Predictor(model.eval(), Tokenizer.for_language_model(folder), device="cpu")
    cfg = pred.cfg
    assert (cfg.dec_depth, cfg.cross_layers, cross_choices(cfg)) == (3, 2, [("layer 1", 0), ("layer 3", 1)])
    with gr.Blocks(), gr.Tabs():
        tab = build_tab(cfg, pred.grid)
    assert [c[1] for c in tab.layer.choices] == [0, 1, 2] and tab.layer.value == 2
    assert [c[0] for c in tab.cross.choices] == ["layer 1", "layer 3"] and tab.cross.value == 1
    e = pred.explain(str(pictures["blue_square"]), COLOR_Q, max_new_tokens=2)
    assert e.self_weights.shape[0] == 3 and e.cross_weights.shape[0] == 2
    assert [e.cross_layer_number(j) for j in range(2)] == [1, 3]
    ex = Explorer(pred)
    self_last, qk_last = ex.redraw_self(e, 0, 2, h.MEAN, 1)  # self-attention layer 3: reachable now
    self_first, qk_first = ex.redraw_self(e, 0, 0, h.MEAN, 0)
    assert self_last.tobytes() != self_first.tobytes() and qk_last.tobytes() != qk_first.tobytes()
    assert np.array_equal(np.asarray(ex.redraw_self(e, 0, 2, h.MEAN, 0)[1]), np.asarray(qk_first))  # its own control
    assert "cross-attention layer must be a whole number from 0 to 1, got 2" in _error(
        ex.redraw_self, e, 0, 0, h.MEAN, 2).message
    names = [os.path.basename(f) for f in ex.export(e, 0, 2, h.MEAN, 1, 1, 0)]
    assert any(n.endswith("_layer1_head1.png") for n in names) and "self_attention_layer3.png" in names
    npz = next(f for f in ex.export(e, 0, 0, 0, 1, 1) if f.endswith(".npz"))
    assert np.load(npz)["cross_layer_ids"].tolist() == [0, 2]
