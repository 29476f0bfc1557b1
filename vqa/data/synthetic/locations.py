"""Where an object is, as words: the answer format of the corpus's location questions ("where is the red
star?" -> "5 11 4": its centre's column and row on a GRID x GRID grid over the picture and its diameter in grid
cells; "nowhere" when the picture has no such object), and its reading back into pixels (`Predictor.point`).
"""

from __future__ import annotations

GRID = 16  # location answers: cells of a GRID x GRID grid over the picture
WHERE_Q = ("where is the {}?", "point at the {}.")
NOWHERE = "nowhere"


def location(o: dict, side: int) -> str:
    """'5 11 4': the column and row of o's centre and its diameter, in cells of a GRID x GRID grid."""
    col, row = (min(GRID - 1, int(GRID * v / side)) for v in (o["x"], o["y"]))
    return f"{col} {row} {max(1, round(GRID * o['d'] / side))}"


def parse_location(text: str, side_x: float, side_y: float) -> tuple[tuple[float, float], tuple] | None:
    """The point (x, y) and box (left, top, right, bottom) in pixels of a picture side_x x side_y that a
    location answer names, or None for "nowhere" or a text that is not one."""
    words = text.split()
    if len(words) != 3 or not all(w.isdigit() for w in words):
        return None
    col, row, size = (int(w) for w in words)
    if not (col < GRID and row < GRID and size >= 1):
        return None
    cx, cy = (col + 0.5) * side_x / GRID, (row + 0.5) * side_y / GRID
    hx, hy = size * side_x / GRID / 2, size * side_y / GRID / 2
    return (cx, cy), (max(0.0, cx - hx), max(0.0, cy - hy), min(side_x, cx + hx), min(side_y, cy + hy))


__all__ = ["GRID", "NOWHERE", "WHERE_Q", "location", "parse_location"]
