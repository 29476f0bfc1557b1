"""Where each text row of a training batch goes (vqa.data.packing.plan): every row in exactly one packed row,
images mixed to leave no padding, best-fit decreasing at each candidate length (the longest row and multiples
of 8 up to `max_len`), and the plan with the fewest tokens, the shorter length on a tie."""

from __future__ import annotations

import random

import pytest

from vqa.data.packing import plan

LENGTHS = [[[5, 5], [5, 5]], [[3, 9, 2], [20], [4]], [[7] * 6, [7], [7, 7]], [[1], [], [30, 2, 2, 2]],
           [[13, 14, 12, 15, 16], [11] * 9, [18, 3], [12, 12, 12]]]


@pytest.mark.parametrize("multiple", [1, 8])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_plan_puts_every_row_in_exactly_one_packed_row_within_the_length(lengths, multiple):
    t, layout = plan(lengths, multiple)
    assert t % multiple == 0 and t >= max(n for ls in lengths for n in ls)
    placed = sorted(seg for row in layout for seg in row)
    assert placed == [(m, j) for m, ls in enumerate(lengths) for j in range(len(ls))]
    assert all(sum(lengths[m][j] for m, j in row) <= t for row in layout)
    assert all(row for row in layout)  # no empty packed row


def test_plan_mixes_images_to_leave_no_padding():
    """Images of 5 + 3, 5 + 3 and 6 + 2 tokens: three rows of 8, each row holding text of several images."""
    t, layout = plan([[5, 3], [5, 3], [6, 2]])
    assert (t, len(layout)) == (8, 3)  # 24 tokens for 24: no padding at all
    assert any(len({m for m, _ in row}) > 1 for row in layout)


def best_fit_decreasing(lengths: list[list[int]], cap: int) -> list[list[tuple[int, int]]]:
    """Every (image, row) by length, longest first (ties in image then row order), each into the packed row
    with the least room left that holds it (the latest such row on a tie), else a new row."""
    order = sorted(((n, m, j) for m, ls in enumerate(lengths) for j, n in enumerate(ls)), key=lambda s: -s[0])
    rows, room = [], []
    for n, m, j in order:
        fits = [r for r in range(len(rows)) if room[r] >= n]
        if fits:
            least = min(room[r] for r in fits)
            r = [r for r in fits if room[r] == least][-1]
        else:
            rows.append([])
            room.append(cap)
            r = len(rows) - 1
        rows[r].append((m, j))
        room[r] -= n
    return rows


@pytest.mark.parametrize("multiple", [1, 8])
def test_plan_pads_no_more_than_best_fit_at_any_candidate_length(multiple):
    """Against best-fit decreasing written out here: at every candidate length (the longest row and the
    multiples of 8 up to 128) the chosen plan has no more tokens, and it places rows as best fit does at its
    own cap."""
    rng = random.Random(multiple)
    for _ in range(60):
        lengths = [[rng.choice([1, 2, 3, 5, 7, 10, 14, 30]) for _ in range(rng.choice([0, 1, 2, 4, 9]))]
                   for _ in range(rng.randint(1, 12))]
        if not any(lengths):
            lengths[0] = [4]
        t, layout = plan(lengths, multiple)
        tokens = len(layout) * t
        longest = max(n for ls in lengths for n in ls)
        up = lambda n: -(-n // multiple) * multiple  # noqa: E731
        for cap in {longest, *range(-(-longest // 8) * 8, 129, 8)}:
            rows = best_fit_decreasing(lengths, cap)
            fill = max(sum(lengths[m][j] for m, j in row) for row in rows)
            assert tokens <= len(rows) * up(fill), (lengths, cap)


def test_best_fit_puts_each_row_where_the_least_room_holds_it():
    """5, 4, 3, 2, 2 into rows of 8: 3 goes beside 5 (room 3, the least that holds it), not beside 4 (room 4),
    and the two 2s fill the 4's row: two full rows. Into the row with the most room it would take four rows."""
    assert plan([[5, 4, 3, 2, 2]], max_len=8) == (8, [[(0, 0), (0, 2)], [(0, 1), (0, 3), (0, 4)]])


def test_plan_takes_the_shorter_length_on_a_tie():
    """10, 7, 5: three rows of 10 (cap 10) or 10 + 5 and 7 in two rows of 15 (cap 16) are 30 tokens each;
    the shorter rows win, as self-attention's cost grows with the length."""
    assert plan([[10, 7, 5]], max_len=16) == (10, [[(0, 0)], [(0, 1)], [(0, 2)]])


def test_no_packed_row_is_longer_than_max_len_unless_a_text_row_is():
    """9 + 7 would fill one row of 16 exactly, but 16 is past `max_len` 15: two rows of 9. A text row longer
    than `max_len` is a candidate length of its own."""
    assert plan([[9, 7]], max_len=15) == (9, [[(0, 0)], [(0, 1)]])
    assert plan([[9, 7]], max_len=16) == (16, [[(0, 0), (0, 1)]])
    assert plan([[20, 3]], max_len=16) == (20, [[(0, 0)], [(0, 1)]])
