"""The decoding methods, by name: the one list that `GenerationConfig.method`'s choices (so the CLI's
`--method`), the app's dropdown, `vqa.decoding.generate` and the server's batching read.

Each entry names its function, `module:function` under vqa.decoding, with the signature
`(decoder: BatchDecoder, config: GenerationConfig) -> Generation`; `generate` imports it on first use. A name
rather than the function itself, so that this list imports no torch (the CLI's help and option checks run
without it) and the config, a layer below the decoding code, does not import it. A new method is its own
file under vqa/decoding/ and an entry here (its settings, if any, are GenerationConfig fields).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingMethod:
    function: str  # "vqa.decoding.MODULE:FUNCTION"
    random: bool  # the output is drawn from a random generator: a request's own, never shared in a batch
    ranked: bool = False  # returns its `num_beams` outputs likeliest first: what lists the top-k answers


DECODING_METHODS: dict[str, DecodingMethod] = {
    "greedy": DecodingMethod("vqa.decoding.greedy:greedy", random=False),
    "beam": DecodingMethod("vqa.decoding.beam:beam_search", random=False, ranked=True),
    "sample": DecodingMethod("vqa.decoding.sample:sample", random=True),
}


def ranking_methods() -> list[str]:
    """The methods that list several answers (["beam"]), for an error line."""
    return [name for name, m in DECODING_METHODS.items() if m.ranked]


__all__ = ["DecodingMethod", "DECODING_METHODS", "ranking_methods"]
