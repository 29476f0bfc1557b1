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
    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    ref = Familiarity.from_data(pred, shapes_dir, "train", n=10, seed=1)
    assert ref.reference.shape == (10, pred.cfg.dec_width) and "10 pictures of" in ref.source
    np.testing.assert_allclose(np.linalg.norm(ref.reference, axis=1), 1.0, atol=1e-5)
    again = Familiarity.from_data(pred, shapes_dir, "train", n=10, seed=1)
    np.testing.assert_array_equal(ref.reference, again.reference)  # seeded
    # the reference pictures themselves are at distance 0; image_features agrees with and without the cache
    img = draw("red_circle")
    np.testing.assert_allclose(pred.image_features([img]), pred.image_features([img], cache=False), atol=1e-6)
    with pytest.raises(Exception, match="no split"):
        Familiarity.from_data(pred, shapes_dir, "test")
