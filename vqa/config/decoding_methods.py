"""The decoding methods, by name, and what the callers must know of each: the one list that
`GenerationConfig.method`'s choices (so the CLI's `--method`), the app's dropdown and the server's batching read.

The functions themselves are `vqa.decoding.generate.METHODS`, under the same names (tests/test_layers.py holds
the two lists equal): this list imports no torch (the CLI's help and option checks run without it), and the
config, a layer below the decoding code, does not import it. A new method is its own file under vqa/decoding/,
an entry in METHODS and one here (its settings, if any, are GenerationConfig fields).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingMethod:
    random: bool  # the output is drawn from a random generator: a request's own, never shared in a batch
    ranked: bool = False  # returns its `num_beams` outputs likeliest first: what lists the top-k answers


DECODING_METHODS: dict[str, DecodingMethod] = {
    "greedy": DecodingMethod(random=False),
    "beam": DecodingMethod(random=False, ranked=True),
    "sample": DecodingMethod(random=True),
}


def ranking_methods() -> list[str]:
    """The methods that list several answers (["beam"]), for an error line."""
    return [name for name, m in DECODING_METHODS.items() if m.ranked]


__all__ = ["DecodingMethod", "DECODING_METHODS", "ranking_methods"]
