"""A trained tiny checkpoint for the predictor, app and browser tests, built in seconds on a CPU.

Two made-up pictures (a red circle and a blue square, drawn at odd non-square sizes so the letterbox is
exercised), three prompts each (a colour question, a shape question, a caption), a tokenizer trained on those
sentences and a very small model (1-layer ViT of width 32 on 32 px, 2-layer decoder of width 32) trained
until greedy decoding reproduces every target. The checkpoint is written with `vqa.weights.checkpoint.save`, once per
test process, into a temporary folder.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import tiny_config
from PIL import Image, ImageDraw

from vqa.data.transforms import build_transform
from vqa.decoding.generate import generate
from vqa.model import VQAModel
from vqa.tokenizer import Tokenizer
from vqa.weights import checkpoint

COLOR_Q = "what color is the shape?"
SHAPE_Q = "what shape is it?"
ITEMS = {  # name -> (colour, shape, caption)
    "red_circle": ("red", "circle", "a red circle"),
    "blue_square": ("blue", "square", "a blue square"),
}
DISTRACTORS = ["green", "yellow", "triangle"]  # words the tokenizer knows but no picture shows


def draw(name: str, size: tuple[int, int] = (48, 36)) -> Image.Image:
    """The made-up picture `name`: its shape in its colour, centred on light grey."""
    colour, shape, _ = ITEMS[name]
    fill = {"red": (220, 40, 40), "blue": (40, 90, 230)}[colour]
    w, h = size
    img = Image.new("RGB", size, (200, 200, 200))
    d = ImageDraw.Draw(img)
    r = min(w, h) * 0.35
    box = (w / 2 - r, h / 2 - r, w / 2 + r, h / 2 + r)
    (d.ellipse if shape == "circle" else d.rectangle)(box, fill=fill)
    return img


def train_checkpoint(folder: str | Path, max_steps: int = 600, seed: int = 0) -> Path:
    """Train the tiny model until it answers and captions both pictures right; save it to `folder`."""
    texts = [COLOR_Q, SHAPE_Q, *DISTRACTORS]
    for colour, shape, cap in ITEMS.values():
        texts += [colour, shape, cap]
    tok = Tokenizer.train(texts * 4, vocab_size=80)
    torch.manual_seed(seed)
    model = VQAModel(tiny_config(**tok.model_ids()))  # the shared tiny config, this tokenizer's ids
    tf = build_transform(model.cfg, train=False)
    names = list(ITEMS)
    images = torch.stack([tf(draw(n)) for n in names])
    prompts, targets, index = [], [], []
    for i, n in enumerate(names):
        colour, shape, cap = ITEMS[n]
        for prompt, target in ((tok.vqa_prompt(COLOR_Q), colour), (tok.vqa_prompt(SHAPE_Q), shape),
                               (tok.caption_prompt(), cap)):
            prompts.append(prompt)
            targets.append(tok.encode(target))
            index.append(i)
    rows = [p + t + [tok.eos_id] for p, t in zip(prompts, targets, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for r, (p, row) in enumerate(zip(prompts, rows, strict=True)):
        ids[r, : len(row)] = torch.as_tensor(row)
        mask[r, len(p) : len(row)] = True
    index_t = torch.as_tensor(index)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    step = 0
    for step in range(1, max_steps + 1):
        model.train()
        loss = model.teacher_forced(images, ids, loss_mask=mask, image_index=index_t, return_logits=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0:
            model.eval()
            out = generate(model, prompts, images, image_index=index_t, max_new_tokens=8).sequences
            if out == targets and loss.item() < 0.01:
                break
    else:
        raise RuntimeError(f"the tiny test model did not fit its {len(rows)} targets in {max_steps} steps")
    model.eval()
    card = dict(preset="test-tiny", data="two made-up pictures (tests/predict_fixtures.py)", train_split="train",
                tasks=["vqa", "caption"], step=step, parameters=model.num_parameters(),
                val_split="train", val_scores={"vqa_accuracy": 1.0})
    return checkpoint.save(Path(folder), model, tok, card)


_BUILT: dict[str, Path] = {}


def shared_checkpoint() -> Path:
    """The trained checkpoint, built once per process in a temporary folder removed at exit."""
    if "path" not in _BUILT:
        root = Path(tempfile.mkdtemp(prefix="vqa-test-ckpt-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _BUILT["path"] = train_checkpoint(root / "run" / "best")  # a run folder, as training writes
    return _BUILT["path"]


# the warnings of gradio's own code that the demo's tests may meet: not ours to fix
DEMO_WARNINGS = [
    pytest.mark.filterwarnings("ignore:.*no_silent_downcasting"),  # gradio's queue calls pandas 3 deprecations
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
    # the explorer's updates set a Dropdown's value alone (its choices stay on the page), as the app always did
    pytest.mark.filterwarnings("ignore:The value passed into gr.Dropdown:UserWarning"),
]


def demo_predictor():
    """The demo's Predictor of the shared test checkpoint, with the app's pixel limit."""
    from vqa.data.images import MAX_PIXELS
    from vqa.inference.predict import Predictor

    return Predictor.from_pretrained(shared_checkpoint(), device="cpu", max_pixels=MAX_PIXELS)


def write_pictures(folder: str | Path) -> dict[str, Path]:
    """The two pictures as PNG files in `folder`: {name: path}."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for n in ITEMS:
        out[n] = folder / f"{n}.png"
        draw(n).save(out[n])
    return out


# ------------------------------------------------------------------------------------------ the app under test

ROOT = Path(__file__).resolve().parents[1]


def load_app_module():
    """app.py (at the repository root, not a package: the entry point over `vqa.demo`) as a module."""
    import importlib.util
    import sys

    if "vqa_demo_app" in sys.modules:
        return sys.modules["vqa_demo_app"]
    spec = importlib.util.spec_from_file_location("vqa_demo_app", ROOT / "app.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vqa_demo_app"] = mod
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(pred):
    """Build and launch the demo around `pred` on 127.0.0.1 at a free port, without blocking; returns
    (demo, url). Close it with demo.close()."""
    from vqa.demo.app import build_app
    from vqa.demo.server import serve

    demo = build_app(pred)
    _, url, _ = serve(demo, host="127.0.0.1", port=free_port(), block=False, quiet=True)
    return demo, url
