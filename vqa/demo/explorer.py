"""The attention explorer's logic: its handlers (`Explorer`, callable without a server), the user's handle to
an explanation (`Explained`) and the views drawn from one. The tab's components are `vqa.demo.explorer_tab`'s,
their wiring `vqa.demo.events`'.

It explains the user's last answer or caption with the model's own attention weights, read on a separate
pass (`Predictor.explain`): the masked self-attention matrix, the chosen token's cross-attention in every
layer and head, its query against every image key, and self-attention inside the ViT from one patch; Export
writes them as PNG and every array as `.npz`. The pictures are drawn only when the tab is opened. A user
keeps a handle to its explanation (`Explained`); the explorer holds the last few for all users together and
builds a dropped one again, so memory does not grow with the users.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict, deque
from pathlib import Path

import gradio as gr

from ..config.generation import in_range
from ..errors import VQAError
from .handlers import MEAN, display_image
from .uploads import fail

EMPTY_HINT = "*Ask a question or caption a picture first; this tab then explains the answer.*"
# export folders kept on disk, from all users: gradio serves its own copy of each file (in its cache, which
# delete_cache empties), so a folder is needed only until its export has been handed over; older ones go
EXPORTS_KEPT = 8
# explanations held in memory, for all users together (an explanation is large, its ViT's attention
# mostly): a user keeps a handle (`Explained`), and an explanation dropped from here is rebuilt on its next use
EXPLANATIONS_KEPT = 8


def explorer_views(e, token: int, layer: int, head: int, row: int, col: int, cross: int) -> tuple:
    """The four pictures: self-attention of decoder layer `layer`, the token's cross-attention grid, its query
    against the keys in cross-attention layer `cross`, the ViT patch's attention (`head` MEAN: every head and
    the mean; the query/keys figure then shows head 0)."""
    from ..inference import figures as af

    head_one = None if head == MEAN else head
    return (af.self_attention_figure(e, layer, head_one), af.cross_attention_grid(e, token),
            af.query_keys_figure(e, token, cross, 0 if head == MEAN else head), af.vit_patch_figure(e, row, col))


def cross_choices(cfg) -> list[tuple[str, int]]:
    """The cross-attention layers, each named by the decoder layer it belongs to (the llama layout has one
    before every dec_cross_every-th layer of the language model)."""
    return [(f"layer {i + 1}", j) for j, i in enumerate(cfg.cross_layer_ids)]


def explorer_choices(e) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {t}", i) for i, t in enumerate(e.generated)]


def _user_errors(method):
    """`method` with a bad control value (one no control offers: an API caller's) as the page's message."""

    @functools.wraps(method)
    def guarded(self, e, *args):
        try:
            return method(self, e, *args)
        except gr.Error:
            raise
        except (VQAError, IndexError, ValueError, TypeError, OverflowError) as err:
            raise fail(err) from None

    return guarded


class Explained:
    """What a user keeps of its explanation: the state it explains (the result, the upload, the display
    copy), from which the explorer rebuilds it when it is no longer among the recent ones."""

    __slots__ = ("state",)

    def __init__(self, state: dict):
        self.state = state


def _check(e):
    if e is None:
        raise gr.Error("Open this tab after asking a question or captioning a picture.",
                       title="Nothing to explain yet", print_exception=False)


def controls(e, token, layer, head, cross=None) -> tuple[int, int, int, int]:
    """(token, layer, head, cross) as the controls offer them (0-based; head MEAN: every head; `cross`: the
    cross-attention layer, None: the last), each checked against `e`'s bounds: an API caller's -1 would
    otherwise pick the last one (Python's negative indexing)."""
    heads = e.self_weights.shape[1]
    n_cross = e.cross_weights.shape[0]
    cross = in_range("cross-attention layer", n_cross - 1 if cross is None or cross == "" else cross, 0,
                     n_cross - 1, integer=True)
    token = in_range("token", 0 if token is None or token == "" else token, 0, max(0, len(e.generated) - 1),
                     integer=True)
    layer = in_range("layer", layer, 0, e.self_weights.shape[0] - 1, integer=True)
    if head != MEAN:
        head = in_range(f"head ({MEAN}: every head)", head, 0, heads - 1, integer=True)
    return token, layer, int(head), cross


def patch(e, row, col) -> tuple[int, int]:
    """The ViT patch (row, column), counted from 1 as the sliders show them, checked against `e`'s grid:
    0-based (row, column)."""
    return (in_range("patch row", row, 1, e.grid, integer=True) - 1,
            in_range("patch column", col, 1, e.grid, integer=True) - 1)


class Explorer:
    """The explorer's handlers around `pred` (a `vqa.Predictor`). `e` is the user's `Explained` handle
    (or an `Explanation`); the last `explanations` explanations used are kept, for all users together."""

    def __init__(self, pred, keep: int = EXPORTS_KEPT, explanations: int = EXPLANATIONS_KEPT):
        self.pred, self.keep, self.explanations = pred, max(1, int(keep)), max(1, int(explanations))
        self._recent: OrderedDict[Explained, object] = OrderedDict()  # handle -> Explanation, oldest first
        self._recent_lock = threading.Lock()
        self._exports: deque[Path] = deque()  # this explorer's export folders, oldest first
        self._exports_lock = threading.Lock()
        weakref.finalize(self, _remove, self._exports)  # the rest go with the explorer, or at exit

    def explain(self, state):
        """Explain the user's last answer or caption: the user's handle to it (`Explained`), the controls
        set for it, the views."""
        from ..inference.figures import top_patch

        cfg = self.pred.cfg
        if not state or state.get("result") is None:  # opened before any question: say what to do
            return (None, gr.Dropdown(choices=[], value=None), gr.Dropdown(), gr.Dropdown(), gr.Slider(),
                    gr.Slider(), EMPTY_HINT, None, None, None, None, gr.Dropdown())
        handle = Explained(state)
        e = self.explanation(handle)
        layer, head, cross = cfg.dec_depth - 1, MEAN, cfg.cross_layers - 1
        row, col = top_patch(e, 0)
        views = explorer_views(e, 0, layer, head, row, col, cross)
        what = f'"{e.question}" → "{e.text}"' if e.question is not None else f'caption: "{e.text}"'
        crossed = ("" if cfg.cross_layers == cfg.dec_depth else
                   f" ({cfg.cross_layers} with cross-attention: layers {', '.join(n for n, _ in cross_choices(cfg))})")
        info = (f"Explaining {what}: {len(e.tokens)} tokens ({e.prompt_len} of prompt), {cfg.dec_depth} decoder "
                f"layers{crossed} x {cfg.dec_heads} heads, a {e.grid}x{e.grid} patch grid.")
        token = gr.Dropdown(choices=explorer_choices(e), value=0 if e.generated else None)
        return (handle, token, gr.Dropdown(value=layer), gr.Dropdown(value=head), gr.Slider(value=row + 1),
                gr.Slider(value=col + 1), info, *views, gr.Dropdown(value=cross))

    def explanation(self, e):
        """The Explanation behind a user's handle: one of the last `explanations` used, or built again
        (the same teacher-forced pass over the same result); anything else (an Explanation) as it is."""
        if not isinstance(e, Explained):
            return e
        with self._recent_lock:
            if e in self._recent:
                self._recent.move_to_end(e)
                return self._recent[e]
        state = e.state
        try:
            built = self.pred.explain(state["source"], result=state["result"])
        except VQAError as err:
            raise fail(err, state["source"]) from None
        built.image = display_image(self.pred, state)  # draw on the display copy
        with self._recent_lock:
            self._recent[e] = built
            while len(self._recent) > self.explanations:
                self._recent.popitem(last=False)
        return built

    @_user_errors
    def redraw_self(self, e, token, layer, head, cross=None):
        """A new layer, head or cross-attention layer: (self-attention, query against the keys)."""
        from ..inference import figures as af

        _check(e)
        e = self.explanation(e)
        token, layer, head, cross = controls(e, token, layer, head, cross)
        qk = af.query_keys_figure(e, token, cross, 0 if head == MEAN else head)
        return af.self_attention_figure(e, layer, None if head == MEAN else head), qk

    @_user_errors
    def redraw_token(self, e, token, layer, head, cross=None):
        """A new token: its cross-attention grid, its query against the keys, and the ViT from its top patch."""
        from ..inference import figures as af

        _check(e)
        e = self.explanation(e)
        token, layer, head, cross = controls(e, token, layer, head, cross)
        row, col = af.top_patch(e, token)
        return (af.cross_attention_grid(e, token), af.query_keys_figure(e, token, cross, 0 if head == MEAN else head),
                af.vit_patch_figure(e, row, col), gr.Slider(value=row + 1), gr.Slider(value=col + 1))

    @_user_errors
    def redraw_patch(self, e, row, col):
        """A new ViT patch (row and column counted from 1)."""
        from ..inference import figures as af

        _check(e)
        e = self.explanation(e)
        return af.vit_patch_figure(e, *patch(e, row, col))

    @_user_errors
    def export(self, e, token, layer, head, row, col, cross=None):
        """The pictures as PNG and the arrays as .npz, in a new temporary folder: their paths. Only the last
        `keep` folders are kept (gradio has copied the older ones into its cache by then)."""
        _check(e)
        e = self.explanation(e)
        (token, layer, head, cross), where = controls(e, token, layer, head, cross), patch(e, row, col)
        folder = Path(tempfile.mkdtemp(prefix="vqa-attention-"))
        try:
            files = e.save(folder, tokens=[token] if e.generated else [], layer=cross,
                           head=0 if head == MEAN else head, patch=where)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._exports_lock:
            self._exports.append(folder)
            old = [self._exports.popleft() for _ in range(len(self._exports) - self.keep)]
        _remove(old)
        return [str(f) for f in files]


def _remove(folders) -> None:
    for folder in list(folders):
        shutil.rmtree(folder, ignore_errors=True)

