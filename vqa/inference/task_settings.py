"""What a model may be asked and how it decodes it: a model answers (and ranks) only if trained for questions
and captions only if trained for captions (its card's `tasks`, as `vqa eval` checks), and the decoding of an
answer or a caption (a GenerationConfig with at least one new token: an answer or caption is never empty).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import DECODING_METHODS, GenerationConfig, ranking_methods
from ..decoding.generate import generation_config
from ..errors import InputError


def check_task(tasks: Sequence[str], task: str) -> None:
    """InputError unless `tasks` (what the model was trained for) holds `task` ("vqa" or "caption")."""
    trained = ", ".join(tasks)
    if task == "vqa" and task not in tasks:
        raise InputError(f"this model is a captioner, trained to caption only (its card's tasks: {trained}): "
                         "it does not answer questions; caption with it, or fine-tune it for questions with "
                         "`vqa train --init-from RUN --data DIR`")
    if task not in tasks:
        raise InputError(f"this model was trained to answer questions only (its card's tasks: {trained}): it "
                         "does not caption; ask it questions, or fine-tune it for captions with `vqa train "
                         "--init-from RUN --data DIR --tasks vqa,caption`")


def answer_settings(tasks: Sequence[str], top_k: int = 1, generation: GenerationConfig | None = None,
                    changes: dict | None = None) -> GenerationConfig:
    """See `Predictor.answer_settings`."""
    check_task(tasks, "vqa")
    default = GenerationConfig.served("vqa", top_k)
    settings = at_least_one_token(generation_config(generation, changes or {}, default))
    ranked = DECODING_METHODS[settings.method].ranked
    if top_k > 1 and not ranked:
        ranking = ranking_methods()
        raise InputError(f"top_k={top_k} lists the {top_k} likeliest answers, which only {' or '.join(ranking)} "
                         f"search finds: {settings.method} decoding gives one answer (use method='{ranking[0]}', "
                         "or top_k=1; `rank` scores a list of answers you give)")
    if ranked and settings.num_beams < top_k:
        raise InputError(f"num_beams={settings.num_beams} cannot return top_k={top_k} answers")
    return settings


def caption_settings(tasks: Sequence[str], generation: GenerationConfig | None = None,
                     changes: dict | None = None) -> GenerationConfig:
    """See `Predictor.caption_settings`."""
    check_task(tasks, "caption")
    return at_least_one_token(generation_config(generation, changes or {}, GenerationConfig.served("caption")))


def at_least_one_token(settings: GenerationConfig) -> GenerationConfig:
    return settings if settings.min_new_tokens >= 1 else settings.replace(min_new_tokens=1)


__all__ = ["check_task", "answer_settings", "caption_settings", "at_least_one_token"]
