"""The attention explorer's pictures, drawn from a `vqa.inference.explain.Explanation` (matplotlib, no pyplot state:
safe from the app's worker threads). Three views, after BertViz's, for a picture and its words:

- `self_attention_figure`: the decoder's masked self-attention matrix of one layer, prompt + generated tokens
  on both axes (rows: the query reading, columns: the key read), each head and the mean over heads; the
  masked upper triangle is grey (a token never sees the tokens after it).
- `cross_attention_grid`: one generated word's cross-attention over the picture for every layer (rows) and
  head (columns), plus the mean over heads, with the patch grid drawn (BertViz's model view, over an image).
- `query_keys_figure`: one word's query against every image key in one layer and head: the raw scores
  q.k / sqrt(d), then the weights after the softmax, cell by cell on the patch grid (the neuron view's two
  steps).
- `vit_patch_figure`: the ViT's self-attention from one image patch, every layer and head, so a patch can be
  followed into the encoder and, through the cross-attention, out to the word.

`save_figures` writes them as PNG files (the `.npz` beside them is `Explanation.save`'s).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from .heatmaps import attention_heatmap, draw_patch_grid

MASKED = "#d9d9d9"  # the causal mask's cells


def _figure(width: float, height: float):
    # imported when drawn: the CLI starts without matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_image(fig) -> Image.Image:
    """A matplotlib Figure as an RGB PIL image."""
    fig.canvas.draw()
    return Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy(), "RGB")


def _thumb(e, side: int) -> Image.Image:
    img = e.image if isinstance(e.image, Image.Image) else Image.new("RGB", (e.image_size, e.image_size), (128,) * 3)
    scale = side / max(img.size)
    return img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.BICUBIC)


def _message(text: str) -> Image.Image:
    fig = _figure(6, 1.2)
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=11, wrap=True)
    return to_image(fig)


def top_patch(e, token: int = 0) -> tuple[int, int]:
    """(row, column) of the patch that generated token `token` attends to most (mean over layers and heads);
    the centre patch when nothing was generated."""
    if not e.generated:
        return e.grid // 2, e.grid // 2
    m = e.cross_maps()[token].mean((0, 1))  # [grid, grid]
    r, c = np.unravel_index(int(m.argmax()), m.shape)
    return int(r), int(c)


# ------------------------------------------------------------------------------------------- the views


def self_attention_figure(e, layer: int, head: int | None = None) -> Image.Image:
    """Layer `layer`'s masked self-attention (0-based): head `head` and the mean over heads, or (head None)
    every head and the mean."""
    w = e.self_weights[layer]  # [H, T, T]
    heads = list(range(w.shape[0])) if head is None else [int(head)]
    panels = [(f"head {h + 1}", w[h]) for h in heads] + [("mean over heads", w.mean(0))]
    t = len(e.tokens)
    side = min(7.0, 1.6 + 0.26 * t)
    cols = min(len(panels), int(np.ceil(np.sqrt(len(panels)))))
    rows = -(-len(panels) // cols)
    fig = _figure(cols * (side + 0.8), rows * (side + 0.3) + 0.5)
    cmap = _cmap("viridis", bad=MASKED)
    upper = np.triu(np.ones((t, t), dtype=bool), 1)
    for i, (name, m) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        im = ax.imshow(np.ma.masked_array(m, upper), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xticks(range(t), e.tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(t), e.tokens, fontsize=8)
        ax.set_xlabel("key (the token read)", fontsize=8)
        ax.set_ylabel("query (the token reading)", fontsize=8)
        if 0 < e.prompt_len < t:  # where the generated tokens start
            for f in (ax.axhline, ax.axvline):
                f(e.prompt_len - 0.5, color="white", lw=1, ls="--")
        if t <= 14:
            for (y, x), v in np.ndenumerate(m):
                if x <= y:
                    ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if v < 0.6 else "black")
        ax.set_title(f"layer {layer + 1}, {name}", fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle("Decoder masked self-attention: each row sums to 1\ngrey: masked (a token never sees later "
                 "tokens); dashed: where the generated tokens start", fontsize=10)
    return to_image(fig)


def _map_grid(e, maps, heads: list[int], title, thumb: int, mark=None):
    """A figure of `maps` [L, H, grid, grid] over the picture: a row per layer, a column per head in `heads` and
    one for the mean over all heads, each map on its own scale with the patch grid drawn (and `mark` outlined);
    `title(layer, name, map)` names a panel."""
    small = _thumb(e, thumb)
    aspect = small.height / small.width
    fig = _figure(1.75 * (len(heads) + 1) + 0.3, 1.75 * aspect * maps.shape[0] + 0.9)
    for layer in range(maps.shape[0]):
        for j, h in enumerate([*heads, None]):
            m = maps[layer, h] if h is not None else maps[layer].mean(0)
            img = draw_patch_grid(attention_heatmap(small, m, image_size=e.image_size, resize=e.resize), e.grid,
                                  e.image_size, mark=mark, resize=e.resize)
            ax = fig.add_subplot(maps.shape[0], len(heads) + 1, layer * (len(heads) + 1) + j + 1)
            ax.imshow(img)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title(layer, f"head {h + 1}" if h is not None else "mean of heads", m), fontsize=7)
    return fig


def cross_attention_grid(e, token: int, thumb: int = 150) -> Image.Image:
    """Generated token `token`'s cross-attention over the picture, every layer (rows) x head (columns) and
    the mean over heads (last column), each map scaled to its own range, with the patch grid drawn."""
    if not e.generated:
        return _message("Nothing was generated, so there is no word to follow.")
    maps = e.cross_maps()[token]  # [L, H, grid, grid]
    fig = _map_grid(e, maps, list(range(maps.shape[1])), thumb=thumb, title=lambda layer, name, m: (
        f"L{e.cross_layer_number(layer)} {name}\nmax {m.max():.2f}, sum {m.sum():.2f}"))
    fig.suptitle(f'Cross-attention of "{e.generated[token]}" (token {token + 1}) over the picture\ndecoder '
                 "layers (rows) x heads (columns); red = most, each map on its own scale", fontsize=9)
    return to_image(fig)


def query_keys_figure(e, token: int, layer: int, head: int) -> Image.Image:
    """Generated token `token`'s query against every image key in `layer` / `head` (0-based): the raw
    scaled scores q.k / sqrt(d) and the weights after the softmax, per patch, and the weights over the
    picture."""
    if not e.generated:
        return _message("Nothing was generated, so there is no query to show.")
    scores, weights = e.query_against_keys(token, layer, head)  # [N] each
    p, g = e.memory_prefix, e.grid
    s_grid, w_grid = scores[p:].reshape(g, g), weights[p:].reshape(g, g)
    fig = _figure(15, 5.4)
    lim = float(np.abs(s_grid).max()) or 1.0
    for i, (title, m, kw, fmt) in enumerate((
        ("1. raw scores q.k / sqrt(d)", s_grid, dict(cmap="coolwarm", vmin=-lim, vmax=lim), "{:.1f}"),
        ("2. after the softmax over all keys (%)", w_grid * 100, dict(cmap="viridis", vmin=0.0), "{:.0f}"),
    )):
        ax = fig.add_subplot(1, 3, i + 1)
        im = ax.imshow(m, interpolation="nearest", **kw)
        if g <= 16:
            hi = float(m.max())
            for (y, x), v in np.ndenumerate(m):
                dark = (v < 0.6 * hi) if i == 1 else abs(v) > 0.6 * lim
                ax.text(x, y, fmt.format(v), ha="center", va="center", fontsize=6 if g > 10 else 7,
                        color="white" if dark else "black")
        ax.set_xticks(range(g), range(1, g + 1))
        ax.set_yticks(range(g), range(1, g + 1))
        ax.tick_params(labelsize=6)
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8)
    ax = fig.add_subplot(1, 3, 3)
    small = _thumb(e, 320)
    ax.imshow(draw_patch_grid(attention_heatmap(small, w_grid, image_size=e.image_size, resize=e.resize), g,
                              e.image_size, resize=e.resize))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("3. the weights over the picture", fontsize=10)
    extra = ", ".join(f"prefix key {j + 1} (CLS): score {scores[j]:.2f}, weight {100 * weights[j]:.1f}%"
                      for j in range(p))
    fig.suptitle(f'Query of "{e.generated[token]}" (token {token + 1}) against every image key, '
                 f'layer {e.cross_layer_number(layer)}, '
                 f"head {head + 1}: the patches hold {100 * w_grid.sum():.1f}% of the weight"
                 + (f"\n{extra}" if extra else ""), fontsize=9)
    return to_image(fig)


def vit_patch_figure(e, row: int, col: int, thumb: int = 150, max_heads: int = 12) -> Image.Image:
    """The ViT's self-attention from patch (row, col): where that patch's query looks among the patches in
    every encoder layer (rows) and head (columns, at most `max_heads`), and the mean over heads; the patch is
    outlined."""
    if e.vit_weights.ndim != 4:
        return _message("The ViT's attention could not be read for this model.")
    maps = e.vit_patch_attention(row, col)  # [Lv, Hv, grid, grid]
    fig = _map_grid(e, maps, list(range(min(maps.shape[1], max_heads))), thumb=thumb, mark=(row, col),
                    title=lambda layer, name, m: f"ViT L{layer + 1} {name}")
    fig.suptitle(f"ViT self-attention from patch (row {row + 1}, column {col + 1}, outlined)\nencoder layers "
                 "(rows) x heads (columns); red = most", fontsize=9)
    return to_image(fig)


# ------------------------------------------------------------------------------------------- export


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:24] or "token"


def save_figures(e, folder: str | Path, tokens: Sequence[int] | None = None, layer: int | None = None,
                 head: int = 0, patch: tuple[int, int] | None = None) -> list[Path]:
    """The explorer's pictures as PNG files in `folder`: the self-attention matrix of every layer (all heads
    and their mean); for each generated token in `tokens` (default: all), its heads x layers cross-attention
    grid and its query against the image keys in `layer` (default: the last) / `head`; the ViT's attention
    from `patch` (default: the patch the first token attends to most)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []

    def put(name: str, img: Image.Image) -> None:
        img.save(folder / name)
        out.append(folder / name)

    n_layers = e.self_weights.shape[0]
    layer = e.cross_weights.shape[0] - 1 if layer is None else int(layer)  # the query/keys figure's cross layer
    for i in range(n_layers):
        put(f"self_attention_layer{i + 1}.png", self_attention_figure(e, i))
    chosen = range(len(e.generated)) if tokens is None else tokens
    for t in chosen:
        word = _slug(e.generated[t])
        put(f"cross_attention_{t + 1:02d}_{word}.png", cross_attention_grid(e, t))
        put(f"query_keys_{t + 1:02d}_{word}_layer{e.cross_layer_number(layer)}_head{head + 1}.png",
            query_keys_figure(e, t, layer, head))
    row, col = patch if patch is not None else top_patch(e, 0)
    put(f"vit_attention_patch_r{row + 1}_c{col + 1}.png", vit_patch_figure(e, row, col))
    return out


def _cmap(name: str, bad: str):
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad=bad)


__all__ = ["self_attention_figure", "cross_attention_grid", "query_keys_figure", "vit_patch_figure",
           "save_figures", "top_patch", "to_image"]
