"""How far a generated token travels: a decoding method's loop, for every token it generates (choosing, reordering
the beams, the step through the model and its KV cache), runs code from at most 4 source files under vqa/, and
a call never goes back up into a file it came down from (recorded with sys.setprofile over a real decoding)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from generate_fixtures import PROMPTS

import vqa
from vqa.config import GenerationConfig
from vqa.decoding.batch import DecodingBatch
from vqa.decoding.beam import beam_search
from vqa.decoding.greedy import greedy

PACKAGE = Path(vqa.__file__).resolve().parent


def walk(run, model, images, **config) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The vqa/ files the decoding method `run` runs code from over a decoding (the DecodingBatch, its prompts
    already in the cache, is built before), in the order first entered, and the calls from a file back up into
    one before it in that order: (caller's file, callee's file, callee's function)."""
    config = GenerationConfig(max_new_tokens=4, min_new_tokens=4, **config)
    decoder = DecodingBatch(model, model.memory_kv(model.encode(images)), PROMPTS, config)
    calls: list[tuple[str, str, str]] = []

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE)):
            caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
            calls.append((caller, frame.f_code.co_filename, frame.f_code.co_name))

    sys.setprofile(record)
    try:
        run(decoder, config)
    finally:
        sys.setprofile(None)
    name = lambda f: str(Path(f).relative_to(PACKAGE.parent))  # noqa: E731
    files: list[str] = []
    for _, callee, _ in calls:
        if name(callee) not in files:
            files.append(name(callee))
    back = [(name(c), name(f), fn) for c, f, fn in calls
            if c.startswith(str(PACKAGE)) and files.index(name(f)) < files.index(name(c))]
    return files, back


@pytest.mark.parametrize("run, config", [(beam_search, {"method": "beam", "num_beams": 3}), (greedy, {})])
def test_a_token_runs_code_from_at_most_4_files_never_going_back_up(model, images, run, config):
    files, back = walk(run, model, images, **config)
    assert files[0] == f"vqa/decoding/{'beam' if run is beam_search else 'greedy'}.py"
    assert "vqa/model/attention.py" in files  # the step through the model was recorded
    assert len(files) <= 4, files
    assert not back, back
