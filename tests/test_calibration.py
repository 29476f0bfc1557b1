"""Calibration of the answers' confidence (vqa.evaluation.calibration): the 15 equal-width bins of Guo et al.
2017, the expected calibration error and accuracy against coverage, each worked by hand."""

import pytest

from vqa.evaluation.calibration import (
    accuracy_at_coverage,
    bin_index,
    calibration_summary,
    expected_calibration_error,
    plot_reliability,
    reliability,
)


def test_bins_are_closed_on_the_right_and_zero_goes_to_the_first():
    # edges k/15: 0.2 = 3/15 closes bin 2 (2/15, 3/15]; 0.21 opens bin 3; 1.0 closes bin 14
    assert bin_index([0.0, 0.01, 1 / 15, 0.2, 0.21, 0.5, 0.9, 1.0]).tolist() == [0, 0, 0, 2, 3, 7, 13, 14]


def test_ece_by_hand():
    # bin 13 holds 0.9 and 0.9 (accuracy 0.5): |0.5 - 0.9| x 2/4; bin 2 holds 0.2 (accuracy 0): 0.2 x 1/4;
    # bin 7 holds 0.5 (accuracy 1): 0.5 x 1/4. ECE = 0.2 + 0.05 + 0.125
    assert expected_calibration_error([0.9, 0.9, 0.2, 0.5], [1, 0, 0, 1]) == pytest.approx(0.375)


def test_ece_counts_an_edge_confidence_in_its_own_bin():
    # 0.2 alone in bin 2 and 0.21 alone in bin 3: (|1 - 0.2| + |0 - 0.21|) / 2. Counting 0.2 in bin 3 would give
    # |0.5 - 0.205| = 0.295
    assert expected_calibration_error([0.2, 0.21], [1.0, 0.0]) == pytest.approx(0.505)


def test_ece_uses_soft_vqa_accuracy_and_is_zero_when_calibrated():
    # one bin (0.2, 0.2667]: confidence 0.25 twice, accuracies 0.3 and 0.2 average 0.25
    assert expected_calibration_error([0.25, 0.25], [0.3, 0.2]) == pytest.approx(0.0)


def test_reliability_table_counts_each_bin():
    bins = reliability([0.05, 0.06, 0.95, 0.5], [1, 0, 1, 0])
    assert len(bins) == 15 and [b["count"] for b in bins if b["count"]] == [2, 1, 1]
    assert bins[0]["confidence"] == pytest.approx(0.055) and bins[0]["accuracy"] == 0.5
    assert bins[14]["lo"] == pytest.approx(14 / 15) and bins[14]["accuracy"] == 1.0
    assert bins[1]["count"] == 0 and bins[1]["accuracy"] is None


def test_accuracy_at_coverage_withholds_the_least_confident():
    conf, acc = [0.3, 0.9, 0.1, 0.8], [0.0, 1.0, 1.0, 0.6]
    got = accuracy_at_coverage(conf, acc, coverages=(100, 75, 50, 25, 10))
    # most confident first: 0.9 (1.0), 0.8 (0.6), 0.3 (0.0), 0.1 (1.0); 10% of 4 keeps ceil(0.4) = 1
    assert got == pytest.approx({"100%": 0.65, "75%": 1.6 / 3, "50%": 0.8, "25%": 1.0, "10%": 1.0})


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one accuracy per confidence"):
        expected_calibration_error([0.5, 0.5], [1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        reliability([1.5], [1.0])


def test_summary_in_percent_and_the_plot(tmp_path):
    s = calibration_summary([0.9, 0.9, 0.2, 0.5], [1, 0, 0, 1])
    assert s["ece"] == 37.5 and s["bins"] == 15 and s["mean_confidence"] == 62.5
    assert s["accuracy_at_coverage"]["100%"] == 50.0 and s["accuracy_at_coverage"]["50%"] == 50.0
    assert s["reliability"][13] == dict(lo=13 / 15, hi=14 / 15, count=2, confidence=90.0, accuracy=50.0)
    png = plot_reliability(s, tmp_path / "reliability.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
