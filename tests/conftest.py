"""Shared fixtures: a tiny Shapes data set built once per test run, the flags that make a very small model, and
the fixtures that several test files share (the generation tests' model and images, the dataset and collate
tests' data, a random GPT-2 folder)."""

from __future__ import annotations

import pytest

# `vqa train --set ...` flags for a model that trains in seconds (1-layer ViT of width 32 on 32 px images)
TINY_SET = [
    "vit_width=32", "vit_depth=1", "vit_heads=2", "vit_image_size=32", "vit_patch_size=8",
    "dec_width=32", "dec_depth=1", "dec_heads=2", "dec_max_len=40",
]


def tiny_set_flags() -> list[str]:
    """A shape of its own, so random weights (the tiny preset's shipped towers have another shape)."""
    return ["--from-scratch", *(arg for item in TINY_SET for arg in ("--set", item))]


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory):
    """VQA_CACHE (the image cache's home) in a temp folder for the whole test run, so that no test (nor a
    `vqa train` it runs in a subprocess) writes into the real user cache. A test that looks at the folder points
    VQA_CACHE at its own tmp_path."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VQA_CACHE", str(tmp_path_factory.mktemp("vqa-cache")))
        yield


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory):
    """A 24-image train / 8-image val Shapes set in the VQA v2 + COCO layout."""
    from vqa.data.synthetic.shapes import generate_shapes

    out = tmp_path_factory.mktemp("shapes")
    generate_shapes(out, n_train=24, n_val=8, size=64, seed=0, progress=False, workers=1)
    return out


@pytest.fixture(scope="session")
def scenes_dir(tmp_path_factory):
    """A 2-image train / 12-image val Scenes set (the grounding and consistency tests')."""
    from vqa.data.synthetic.scenes import generate_scenes

    out = tmp_path_factory.mktemp("scenes")
    generate_scenes(out, n_train=2, n_val=12, size=64, seed=1, progress=False, workers=1)
    return out


@pytest.fixture
def quick_compile(monkeypatch):
    """Compile the decode step without inductor's GEMM autotuning on the CPU: the same code, the matmul kernels
    picked without benchmarking them (a minute less per test; scripts/bench.py times the autotuned ones)."""
    import vqa.decoding.compiled

    monkeypatch.setattr(vqa.decoding.compiled, "INDUCTOR_CPU", vqa.decoding.compiled.INDUCTOR)


# ---------------------------------------------------------------- fixtures that several test files share


@pytest.fixture(scope="module")
def model():
    """The generation tests' model (test_generate*.py): helpers.lively_model, whose <eos> is a token it often
    produces (generate_fixtures.EOS), so that some rows and beams end early and others run out of room."""
    from generate_fixtures import EOS
    from helpers import lively_model

    return lively_model(eos_id=EOS)


@pytest.fixture(scope="module")
def images(model):
    """One random image per prompt of generate_fixtures.PROMPTS, for `model`."""
    from generate_fixtures import PROMPTS
    from helpers import random_images

    return random_images(len(PROMPTS), model.cfg)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The dataset and collate tests' (root, train split, tokenizer) (test_data_dataset.py,
    test_data_collate.py): a 12-image Shapes set and a tokenizer trained on its text."""
    from data_fixtures import build_shapes

    from vqa.data.readers.formats import load_split
    from vqa.data.split import corpus_texts
    from vqa.tokenizer import Tokenizer

    root = build_shapes(tmp_path_factory.mktemp("shapes"), n_train=12, n_val=4, seed=5)
    train = load_split(root, "train")
    tok = Tokenizer.train(corpus_texts(train), vocab_size=300)
    return root, train, tok


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, shapes_dir):
    """A random GPT-2 (2 layers, 32 wide, 4 heads, 64 positions) whose tokenizer knows the Shapes text
    (test_pretrained_lm*.py)."""
    from lm_fixtures import save_tiny_gpt2

    from vqa.data.readers.formats import load_split
    from vqa.data.split import corpus_texts

    texts = list(corpus_texts(load_split(shapes_dir, "train")))
    return save_tiny_gpt2(tmp_path_factory.mktemp("gpt2") / "lm", texts)


# the demo's handlers without a server (tests/test_demo_handlers.py, test_demo_explorer.py); files with a
# predictor of their own define `pred` themselves
@pytest.fixture(scope="module")
def pred():
    from predict_fixtures import demo_predictor

    return demo_predictor()


@pytest.fixture(scope="module")
def handlers(pred):
    from vqa.demo import handlers as h
    from vqa.inference.serving import SharedPredictor

    return h.Handlers(pred, SharedPredictor(pred, max_wait=0.0, attention=True))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    from predict_fixtures import write_pictures

    return write_pictures(tmp_path_factory.mktemp("pictures"))
