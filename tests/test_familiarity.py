"""The familiarity check (vqa.demo.familiarity): the threshold is 1.25 x the largest leave-one-out nearest-neighbour
distance among the reference, a picture's ratio is its nearest-neighbour distance over that, and the
reference is drawn from a data folder the way training reads it."""

from __future__ import annotations

import numpy as np
import pytest
from predict_fixtures import draw, shared_checkpoint

from vqa.demo.familiarity import Familiarity
from vqa.errors import InputError


def test_threshold_and_ratio_on_known_vectors():
    # three unit vectors at 0, 10 and 30 degrees in a plane: nearest-neighbour angles 10, 10, 20 degrees
    ang = np.radians([0.0, 10.0, 30.0])
    ref = Familiarity(np.stack([np.cos(ang), np.sin(ang), np.zeros(3)], 1) * [[1.0], [2.0], [0.5]])  # any length
    assert ref.threshold == pytest.approx(1.25 * (1 - np.cos(np.radians(20))))
    probe = np.array([[np.cos(np.radians(5)), np.sin(np.radians(5)), 0.0],  # 5 degrees from the nearest
                      [0.0, 0.0, 3.0]])  # 90 degrees from all of them
    np.testing.assert_allclose(ref.distance(probe), [1 - np.cos(np.radians(5)), 1.0], atol=1e-6)
    ratio = ref.ratio(probe)
    assert ratio[0] < 1 < ratio[1]
    assert ratio[1] == pytest.approx(1.0 / ref.threshold)


def test_a_reference_needs_two_pictures():
    with pytest.raises(InputError, match="at least 2"):
        Familiarity(np.ones((1, 4)))


def test_from_data_reads_the_training_split(shapes_dir):
    from vqa.data.readers.formats import load_split
    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    ref = Familiarity.from_data(pred, shapes_dir, "train", n=10, seed=1)
    assert ref.reference.shape == (10, pred.cfg.dec_width) and "10 pictures of" in ref.source
    np.testing.assert_allclose(np.linalg.norm(ref.reference, axis=1), 1.0, atol=1e-5)
    again = Familiarity.from_data(pred, shapes_dir, "train", n=10, seed=1)
    np.testing.assert_array_equal(ref.reference, again.reference)  # seeded
    # the reference pictures themselves are at distance 0: each reference vector is the encoding of a
    # different training picture (the reference: every training picture encoded directly, without the cache)
    train = sorted(load_split(shapes_dir, "train", quiet=True).images())
    feats = _encoded(pred, train)
    dist = 1 - ref.reference @ feats.T  # [10, 24]
    assert np.allclose(dist.min(1), 0, atol=1e-5) and len(set(dist.argmin(1).tolist())) == 10
    assert (ref.distance(feats) < 1e-5).sum() == 10  # ... and only those 10 of the 24
    with pytest.raises(Exception, match="no split"):
        Familiarity.from_data(pred, shapes_dir, "test")


def _encoded(pred, images) -> np.ndarray:
    """The reference features: model.encode of each picture alone, tokens averaged, L2-normalised."""
    import torch

    out = []
    for img in images:
        with torch.no_grad():
            tokens = pred.model.encode(pred.transform(pred.load(img))[None].to(pred.device, pred.dtype))
        v = tokens.float().mean(1)[0].cpu().numpy()
        out.append(v / np.linalg.norm(v))
    return np.stack(out)


def test_image_features_agree_with_and_without_the_cache(monkeypatch):
    import vqa.inference.predict as predict
    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    a, b = draw("red_circle"), draw("blue_square", (40, 56))
    want = _encoded(pred, [a, b])
    assert 1 - want[0] @ want[1] > 1e-3  # two pictures the model tells apart
    encoded, real = [], predict.encode_images
    monkeypatch.setattr(predict, "encode_images", lambda m, x, c: encoded.append(len(x)) or real(m, x, c))
    pred.encodings.clear()
    np.testing.assert_allclose(pred.image_features([a, b]), want, atol=1e-5)  # encoded, then cached
    np.testing.assert_allclose(pred.image_features([b, a, b]), want[[1, 0, 1]], atol=1e-5)  # from the cache
    assert encoded == [2]  # the second call was answered from the cache
    np.testing.assert_allclose(pred.image_features([a, b], cache=False), want, atol=1e-5)
