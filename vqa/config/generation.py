"""`GenerationConfig`: how text is decoded (greedy, beam search, sampling), validated here and passed whole
through `generate`, the `Predictor`, the CLI, evaluation and the app."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError
from .base import _Config, _opt
from .decoding_methods import DECODING_METHODS

ANSWER_TOKENS = 10  # VQA answers are a few words: the default budget when decoding answers
# the default caption budget: every preset's whole context (at most 64 positions), a few sentences for a model
# with a longer one (an imported GPT-2 has 1,024), whose cache is sized to what a request may write
CAPTION_TOKENS = 64
SEED_MAX = 2**63 - 1  # seeds the app accepts: 0 .. this (torch.Generator.manual_seed takes any of them)
# the lowest sampling temperature: logits / 1e-4 stay finite in float32 (decoding divides float32 logits),
# whereas a temperature near float's smallest makes them infinite and the probabilities NaN
MIN_TEMPERATURE = 1e-4


@dataclass
class GenerationConfig(_Config):
    """How to decode. `method` is one of `DECODING_METHODS` (greedy, beam, sample); each other field
    names the methods it applies to. Validated on creation, so a bad value fails before any work. The CLI
    options come from these fields, and the app shows a control for every field with `ui` metadata (a
    slider's (min, max, step), or "number" with its `bounds`); the server checks what the app sends against
    the same bounds (`ui_bounds`, `ui_value`)."""

    method: str = field(default="greedy", metadata=_opt("decoding method", choices=tuple(DECODING_METHODS)))
    max_new_tokens: int | None = field(default=None, metadata=_opt(
        f"longest output in tokens (default: {ANSWER_TOKENS} for answers, {CAPTION_TOKENS} for captions; at most "
        "the context the prompt leaves)"))
    min_new_tokens: int = field(default=0, metadata=_opt(
        "<eos> is not allowed before this many tokens (answers and captions: at least 1)"))
    num_beams: int = field(default=3, metadata=_opt("beam: hypotheses kept per prompt", ui=(1, 5, 1)))
    length_penalty: float = field(default=1.0, metadata=_opt(
        "beam: hypotheses rank by log-probability / length ** this (0: total log-probability)", ui=(0.0, 2.0, 0.1)))
    early_stopping: bool = field(default=False, metadata=_opt(
        "beam: stop a prompt as soon as it has num_beams ended hypotheses (Hugging Face's early_stopping=True); "
        "by default it stops only when no live beam can still beat them, so the result is that of running "
        "every beam to the end (their early_stopping='never')"))
    temperature: float = field(default=1.0, metadata=_opt(
        f"sample: divide the logits by this (at least {MIN_TEMPERATURE:g}; near 0 is method greedy)",
        ui=(0.1, 2.0, 0.1)))
    top_k: int = field(default=0, metadata=_opt("sample: keep the k likeliest tokens (0: all)", ui=(0, 50, 1)))
    top_p: float = field(default=1.0, metadata=_opt("sample: keep the smallest set of this probability",
                                                    ui=(0.05, 1.0, 0.05)))
    seed: int | None = field(default=None, metadata=_opt("sample: a seed for a reproducible output", ui="number",
                                                         bounds=(0, SEED_MAX)))

    def __post_init__(self) -> None:
        if self.method not in DECODING_METHODS:
            raise ConfigError(f"unknown decoding method {self.method!r}; choose one of: {', '.join(DECODING_METHODS)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ConfigError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.num_beams < 1:
            raise ConfigError(f"num_beams must be >= 1, got {self.num_beams}")
        if not (math.isfinite(self.temperature) and self.temperature >= MIN_TEMPERATURE):
            raise ConfigError(f"temperature must be a finite number >= {MIN_TEMPERATURE:g}, got {self.temperature} "
                              "(for temperature -> 0, use method greedy)")
        if not math.isfinite(self.length_penalty):
            raise ConfigError(f"length_penalty must be a finite number, got {self.length_penalty}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @staticmethod
    def ui_bounds(name: str) -> tuple[int | float, int | float]:
        """(min, max) of the app's control for field `name`: its slider's ends, or a number box's `bounds`."""
        meta = next(f.metadata for f in fields(GenerationConfig) if f.name == name)
        ui = meta["ui"]
        return (ui[0], ui[1]) if isinstance(ui, tuple) else meta["bounds"]

    @staticmethod
    def ui_value(name: str, value: Any) -> int | float:
        """`value` (from the app's control for field `name`, or an API caller) as the field's type, checked
        against the control's bounds (`ui_bounds`): ConfigError naming the field otherwise."""
        f = next(f for f in fields(GenerationConfig) if f.name == name)
        return in_range(name, value, *GenerationConfig.ui_bounds(name), integer=str(f.type).startswith("int"))

    @classmethod
    def for_task(cls, task: str, **changes) -> GenerationConfig:
        """The defaults for "vqa" (answers: at most ANSWER_TOKENS tokens) or "caption" (CAPTION_TOKENS), then
        `changes`. Both have min_new_tokens=1: an answer or a caption is never empty (<eos> cannot come first)."""
        budget = ANSWER_TOKENS if task == "vqa" else CAPTION_TOKENS
        base = dict(max_new_tokens=budget, min_new_tokens=1)
        return cls.from_dict({**base, **changes})

    @classmethod
    def served(cls, task: str, top_k: int = 1, **changes) -> GenerationConfig:
        """What `vqa ask` / `vqa caption`, the Predictor, collections and the demo decode with unless told
        otherwise, and so what `vqa eval` scores: answers by beam search over max(top_k, 3) beams at length
        penalty 0, captions greedily (`for_task`'s budgets); then `changes`, min_new_tokens at least 1."""
        base = dict(method="beam", num_beams=max(int(top_k), 3), length_penalty=0.0) if task == "vqa" else {}
        settings = cls.for_task(task, **{**base, **changes})
        return settings if settings.min_new_tokens >= 1 else settings.replace(min_new_tokens=1)

    def describe(self) -> str:
        """The decoding in words, for a results table: "beam search (3 beams, length penalty 0)", "greedy",
        "sample (temperature 0.7, top-p 0.9)"; a method without settings here is its name."""
        if self.method == "beam":
            return f"beam search ({self.num_beams} beams, length penalty {self.length_penalty:g})"
        if self.method == "sample":
            parts = [f"temperature {self.temperature:g}"] + [f"top-k {self.top_k}"] * (self.top_k > 0)
            parts += [f"top-p {self.top_p:g}"] * (self.top_p < 1) + [f"seed {self.seed}"] * (self.seed is not None)
            return f"sample ({', '.join(parts)})"
        return self.method

    def budget(self, limit: int) -> int:
        """New tokens allowed for a prompt that leaves `limit` positions of the context."""
        return limit if self.max_new_tokens is None else min(self.max_new_tokens, limit)


def in_range(name: str, value: Any, lo: int | float, hi: int | float, integer: bool = False) -> int | float:
    """`value` as a number (an int with `integer`) from `lo` to `hi`; ConfigError naming `name` otherwise
    (not a number, NaN, infinite, out of range, or not whole where a whole number is needed)."""
    what = f"{name} must be {'a whole number' if integer else 'a number'} from {lo} to {hi}"
    if isinstance(value, bool):
        raise ConfigError(f"{what}, got {value!r}")
    try:
        number = value if isinstance(value, int) else float(value)  # an int exactly, however large
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what}, got {value!r}") from None
    whole = isinstance(number, int) or (math.isfinite(number) and number.is_integer())
    if not (math.isfinite(number) and lo <= number <= hi) or (integer and not whole):
        raise ConfigError(f"{what}, got {value!r}")
    return int(number) if integer else float(number)
