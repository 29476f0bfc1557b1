"""The attention explorer tab: its handlers (`Explorer`, callable without a server), the user's handle to an
explanation (`Explained`), the views drawn from one and the tab's components (`build_tab`, an `ExplorerTab`),
which `vqa.demo.app` wires to the handlers.

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
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from ..config.generation import in_range
from ..errors import VQAError
from ..inference import figures as af
from .handlers import MEAN, display_image
from .uploads import fail

EXPLORER_INTRO = """
### How the model read the picture
Ask a question or caption a picture first; this tab then explains that last answer with the model's own
attention weights, read on a separate pass. **Masked self-attention**: how each token of the prompt and the
answer reads the tokens before it (rows: the reading token; the grey triangle is masked). **Cross-attention**:
where a generated word looks in the picture, in every decoder layer and head. **Query against the keys**: the
two steps of attention for that word: the raw scores q.k/sqrt(d), then the softmax. **ViT**: where one image
patch looks inside the image encoder (by default the patch the word looks at most), so it can be followed
into the ViT and out to the word. Export writes the pictures as PNG and every array as `.npz`.
"""
EMPTY_HINT = "*Ask a question or caption a picture first; this tab then explains the answer.*"
# export folders kept on disk, from all users: gradio serves its own copy of each file (in its cache, which
# delete_cache empties), so a folder is needed only until its export has been handed over; older ones go
EXPORTS_KEPT = 8
# explanations held in memory, for all users together (an explanation is large, its ViT's attention
# mostly): a user keeps a handle (`Explained`), and an explanation dropped from here is rebuilt on its next use
EXPLANATIONS_KEPT = 8


def cross_choices(cfg) -> list[tuple[str, int]]:
    """The cross-attention layers, each named by the decoder layer it belongs to (the llama layout has one
    before every dec_cross_every-th layer of the language model)."""
    return [(f"layer {i + 1}", j) for j, i in enumerate(cfg.cross_layer_ids)]


def _explained(method):
    """`method` given the user's Explanation (none yet: a message saying so), with a bad control value (one no
    control offers: an API caller's) as the page's message."""

    @functools.wraps(method)
    def guarded(self, e, *args):
        if e is None:
            raise gr.Error("Open this tab after asking a question or captioning a picture.",
                           title="Nothing to explain yet", print_exception=False)
        try:
            return method(self, self.explanation(e), *args)
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
        cfg = self.pred.cfg
        if not state or state.get("result") is None:  # opened before any question: say what to do
            return (None, gr.Dropdown(choices=[], value=None), gr.Dropdown(), gr.Dropdown(), gr.Slider(),
                    gr.Slider(), EMPTY_HINT, None, None, None, None, gr.Dropdown())
        handle = Explained(state)
        e = self.explanation(handle)
        layer, head, cross = cfg.dec_depth - 1, MEAN, cfg.cross_layers - 1
        row, col = af.top_patch(e, 0)
        # every head and their mean; the query/keys figure: head 0
        views = (af.self_attention_figure(e, layer), af.cross_attention_grid(e, 0),
                 af.query_keys_figure(e, 0, cross, 0), af.vit_patch_figure(e, row, col))
        what = f'"{e.question}" → "{e.text}"' if e.question is not None else f'caption: "{e.text}"'
        crossed = ("" if cfg.cross_layers == cfg.dec_depth else
                   f" ({cfg.cross_layers} with cross-attention: layers {', '.join(n for n, _ in cross_choices(cfg))})")
        info = (f"Explaining {what}: {len(e.tokens)} tokens ({e.prompt_len} of prompt), {cfg.dec_depth} decoder "
                f"layers{crossed} x {cfg.dec_heads} heads, a {e.grid}x{e.grid} patch grid.")
        token = gr.Dropdown(choices=[(f"{i + 1}. {t}", i) for i, t in enumerate(e.generated)],
                            value=0 if e.generated else None)
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

    @_explained
    def redraw_self(self, e, token, layer, head, cross=None):
        """A new layer, head or cross-attention layer: (self-attention, query against the keys)."""
        token, layer, head, cross = controls(e, token, layer, head, cross)
        qk = af.query_keys_figure(e, token, cross, 0 if head == MEAN else head)
        return af.self_attention_figure(e, layer, None if head == MEAN else head), qk

    @_explained
    def redraw_token(self, e, token, layer, head, cross=None):
        """A new token: its cross-attention grid, its query against the keys, and the ViT from its top patch."""
        token, layer, head, cross = controls(e, token, layer, head, cross)
        row, col = af.top_patch(e, token)
        return (af.cross_attention_grid(e, token), af.query_keys_figure(e, token, cross, 0 if head == MEAN else head),
                af.vit_patch_figure(e, row, col), gr.Slider(value=row + 1), gr.Slider(value=col + 1))

    @_explained
    def redraw_patch(self, e, row, col):
        """A new ViT patch (row and column counted from 1)."""
        return af.vit_patch_figure(e, *patch(e, row, col))

    @_explained
    def export(self, e, token, layer, head, row, col, cross=None):
        """The pictures as PNG and the arrays as .npz, in a new temporary folder: their paths. Only the last
        `keep` folders are kept (gradio has copied the older ones into its cache by then)."""
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


# ------------------------------------------------------------------------------------------- the tab


@dataclass
class ExplorerTab:
    """The tab and its components."""

    tab: gr.Tab
    token: gr.Dropdown
    layer: gr.Dropdown
    head: gr.Dropdown
    cross: gr.Dropdown
    row: gr.Slider
    col: gr.Slider
    explain_btn: gr.Button
    export_btn: gr.Button
    info: gr.Markdown
    self_img: gr.Image
    cross_img: gr.Image
    qk_img: gr.Image
    vit_img: gr.Image
    files: gr.File


def build_tab(cfg, grid: int) -> ExplorerTab:
    """The "Attention explorer" tab, inside the page's gr.Tabs, for a decoder of `cfg` and a `grid` x `grid`
    patch grid."""
    with gr.Tab("Attention explorer", id="explorer", elem_id="explorer-tab") as tab:
        gr.Markdown(EXPLORER_INTRO)
        with gr.Row(equal_height=True):
            token = gr.Dropdown([], label="Generated token (its query)", elem_id="ex-token", scale=2)
            layer = gr.Dropdown([(f"layer {i + 1}", i) for i in range(cfg.dec_depth)],
                                value=cfg.dec_depth - 1, label="Decoder layer (self-attention)", elem_id="ex-layer")
            cross = gr.Dropdown(cross_choices(cfg), value=cfg.cross_layers - 1,
                                label="Cross-attention layer (query against the keys)", elem_id="ex-cross")
            head = gr.Dropdown([("every head and the mean", MEAN)]
                               + [(f"head {i + 1}", i) for i in range(cfg.dec_heads)],
                               value=MEAN, label="Head", elem_id="ex-head")
            row = gr.Slider(1, grid, value=1, step=1, label="ViT: patch row", elem_id="ex-row")
            col = gr.Slider(1, grid, value=1, step=1, label="ViT: patch column", elem_id="ex-col")
        with gr.Row():
            explain_btn = gr.Button("Explain the last answer", variant="primary", elem_id="explain-button")
            export_btn = gr.Button("Export (PNG + .npz)", elem_id="export-button")
        info = gr.Markdown(elem_id="explorer-info")
        with gr.Row():
            self_img = gr.Image(label="Masked self-attention (prompt + generated tokens)", type="pil",
                                format="png", interactive=False, show_label=False, elem_id="self-attention")
            cross_img = gr.Image(label="Cross-attention of the token: layers x heads", type="pil",
                                 format="png", interactive=False, show_label=False, elem_id="cross-grid")
        qk_img = gr.Image(label="The token's query against every image key: scores, then softmax",
                          type="pil", format="png", interactive=False, show_label=False, elem_id="query-keys")
        with gr.Row():
            vit_img = gr.Image(label="Inside the ViT: self-attention from one patch", type="pil",
                               format="png", interactive=False, show_label=False, elem_id="vit-attention")
            files = gr.File(label="Export", file_count="multiple", interactive=False, elem_id="export")
    return ExplorerTab(tab, token, layer, head, cross, row, col, explain_btn, export_btn, info, self_img, cross_img,
                       qk_img, vit_img, files)
