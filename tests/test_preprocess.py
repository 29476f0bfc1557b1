"""One preprocessing for every picture (`vqa.data.preprocess`): training's input tensor for a picture is the
Predictor's for the same picture and model, whatever the resize, the file format and the orientation; a JPEG
is never decoded smaller than the resize needs; the image cache is never shared across resize settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_fixtures import write_jsonl
from helpers import tiny_model
from PIL import Image

from vqa.config import ModelConfig
from vqa.data.collate import make_collate
from vqa.data.dataset import ImageTextDataset
from vqa.data.images import fit, load_image
from vqa.data.loader import TrainingMicroBatches
from vqa.data.preprocess import Preprocess, model_picture
from vqa.data.readers.formats import load_split
from vqa.data.stream import Layout
from vqa.data.transforms import build_transform
from vqa.inference import predict
from vqa.inference.predict import Predictor
from vqa.tokenizer import Tokenizer

SIZES = {"landscape": (400, 120), "portrait": (120, 400)}  # 1/8 of the short side is under 32 px


def stripes(size: tuple[int, int]) -> Image.Image:
    """Thin stripes across the short side and a colour ramp: what a too-small decode flattens."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    across = (x if w < h else y) // 3 % 2 * 200
    arr = np.stack([across, x * 255 // w, y * 255 // h], -1).astype(np.uint8)
    return Image.fromarray(arr)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """A JSONL data folder of the pictures (JPEG and PNG, landscape and portrait) and its tokenizer."""
    root = tmp_path_factory.mktemp("pictures")
    (root / "pics").mkdir()
    rows = []
    for shape, size in SIZES.items():
        for ext in ("jpg", "png"):
            name = f"pics/{shape}.{ext}"
            stripes(size).save(root / name, quality=90) if ext == "jpg" else stripes(size).save(root / name)
            rows.append({"image": name, "question": "what is it?", "answers": ["stripes"], "caption": "stripes"})
    write_jsonl(root / "train.jsonl", rows)
    tok = Tokenizer.train(["what is it?", "stripes"] * 4, vocab_size=60)
    return root, tok


def encoder_input(pred: Predictor, image, monkeypatch) -> torch.Tensor:
    """The float tensor [3, S, S] the Predictor's encoder gets for `image` when it answers a question."""
    seen = []
    real = predict.encode_images

    def spy(model, batch, compile):
        seen.append(batch.clone())
        return real(model, batch, compile)

    monkeypatch.setattr(predict, "encode_images", spy)
    pred.encodings.clear()
    pred.answer(image, "what is it?")
    return seen[0][0]


@pytest.mark.parametrize("resize,resample", [("letterbox", "bicubic"), ("squash", "bilinear")])
def test_training_input_equals_the_predictors(pictures, resize, resample, tmp_path, monkeypatch):
    """For every picture, the data set's tensor (training and `vqa eval`, also when read back from the image
    cache) normalised is exactly what the Predictor's encoder gets from the same file, and the uint8 input is
    the demo's, the collections' and the ONNX runtime's."""
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    root, tok = pictures
    model = tiny_model(**tok.model_ids(), vit_resize=resize, vit_resample=resample)
    pred = Predictor(model, tok, device="cpu")
    split = load_split(root, "train")
    batches = TrainingMicroBatches(split, tok, build_transform(model.cfg, train=True), 32, ("vqa", "caption"), 1, 1, 0,
                           Layout(batch=2), make_collate(tok.pad_id), image_cache="auto")
    assert batches.cache is not None
    ds = ImageTextDataset(split, tok, build_transform(model.cfg, train=False), 32, train=False,
                          image_cache=batches.cache)
    tf = build_transform(model.cfg, train=False)
    for i, path in enumerate(ds.images):
        decoded, cached = ds[i]["image"], ds[i]["image"]
        assert torch.equal(decoded, cached)
        served = encoder_input(pred, path, monkeypatch)
        assert torch.equal(tf.finish(decoded), served), path
        assert torch.equal(pred.model_input(path), decoded)  # what the demo and collections hand the model
        onnx = np.asarray(model_picture(path, Preprocess.from_config(model.cfg))).transpose(2, 0, 1)
        assert np.array_equal(onnx, decoded.numpy())  # what the ONNX runtime normalises
    batches.close()


def test_a_squashed_jpeg_is_never_decoded_below_the_models_side(pictures):
    """A wide JPEG squashed to 32 px: drafted no smaller than 32 px on its short side (1/2 scale here), so its
    input is within 4 levels (mean; 2.96 measured on these 3 px stripes) of a full-size decode; decoding it at
    1/8 (the short side at 15 px, stretched: what a longest-side draft gives) is more than twice as far."""
    root, tok = pictures
    cfg = ModelConfig(vit_image_size=32, vit_patch_size=8, vit_resize="squash", vit_resample="bilinear")
    tf = build_transform(cfg, train=False)
    for shape in SIZES:
        path = root / "pics" / f"{shape}.jpg"
        full = np.asarray(fit(load_image(path), 32, tuple(tf.fill), "squash", "bilinear"), dtype=np.float32)
        got = tf.prepare(str(path)).permute(1, 2, 0).numpy().astype(np.float32)
        with Image.open(path) as im:
            im.draft("RGB", (im.width // 8, im.height // 8))
            small = np.asarray(fit(im.convert("RGB"), 32, tuple(tf.fill), "squash", "bilinear"), dtype=np.float32)
        assert np.abs(got - full).mean() < 4.0
        assert np.abs(small - full).mean() > 2 * np.abs(got - full).mean()  # what the check tells apart


def test_runs_with_other_resize_settings_never_share_cached_pixels(pictures, tmp_path, monkeypatch):
    """Two runs on the same pictures, one letterboxing (bicubic) and one squashing (bilinear), with the
    default `auto` cache: the second reads its own pixels, never the first run's."""
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    root, tok = pictures
    split = load_split(root, "train")
    got = {}
    for resize, resample in (("letterbox", "bicubic"), ("squash", "bilinear")):
        cfg = ModelConfig(vit_image_size=32, vit_patch_size=8, vit_resize=resize, vit_resample=resample)
        tb = TrainingMicroBatches(split, tok, build_transform(cfg, train=True), 32, ("vqa", "caption"), 1, 1, 0,
                          Layout(batch=2), make_collate(tok.pad_id), image_cache="auto", quiet=True)
        ds = tb.dataset
        got[resize] = [ds._prepared(i) for i in range(len(ds))]  # fills the cache
        got[resize] = [tb.cache.get(i) for i in range(len(ds))]  # and reads it back
        want = [build_transform(cfg, train=False).prepare(p) for p in ds.images]
        assert all(torch.equal(a, b) for a, b in zip(got[resize], want, strict=True)), resize
        tb.close()
    assert not torch.equal(got["letterbox"][0], got["squash"][0])
