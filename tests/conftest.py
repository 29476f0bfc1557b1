"""Shared fixtures: a tiny Shapes data set built once per session, and the flags that make a very small model."""

from __future__ import annotations

import pytest

# `vqa train --set ...` flags for a model that trains in seconds (1-layer ViT of width 32 on 32 px images)
TINY_SET = [
    "vit_width=32", "vit_depth=1", "vit_heads=2", "vit_image_size=32", "vit_patch_size=8",
    "dec_width=32", "dec_depth=1", "dec_heads=2", "dec_max_len=40",
]


def tiny_set_flags() -> list[str]:
    return [arg for item in TINY_SET for arg in ("--set", item)]


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory):
    """VQA_CACHE (the image cache's home) in a temp folder for the whole session, so that no test (nor a
    `vqa train` it runs in a subprocess) writes into the real user cache. A test that looks at the folder points
    VQA_CACHE at its own tmp_path."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VQA_CACHE", str(tmp_path_factory.mktemp("vqa-cache")))
        yield


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory):
    """A 24-image train / 8-image val Shapes set in the VQA v2 + COCO layout."""
    from vqa.data.shapes import generate_shapes

    out = tmp_path_factory.mktemp("shapes")
    generate_shapes(out, n_train=24, n_val=8, size=64, seed=0, progress=False, workers=1)
    return out


@pytest.fixture
def quick_compile(monkeypatch):
    """Compile the decode step without inductor's GEMM autotuning on the CPU: the same code, the matmul kernels
    picked without benchmarking them (a minute less per test; scripts/bench.py times the autotuned ones)."""
    import vqa.decoding.compiled

    monkeypatch.setattr(vqa.decoding.compiled, "INDUCTOR_CPU", vqa.decoding.compiled.INDUCTOR)
