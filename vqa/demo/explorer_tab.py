"""The attention explorer tab's components: its text (`EXPLORER_INTRO`) and `build_tab`, which returns them as an
`ExplorerTab`. Components only: the handlers are `vqa.demo.explorer`'s, their wiring `vqa.demo.events`'.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .explorer import cross_choices
from .handlers import MEAN

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
