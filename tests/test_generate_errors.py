"""Generation's bad input: empty and over-long prompts, wrong images, bad options, out-of-range token ids and
image indices, for generate, score_candidates, cross_attention_maps and the tokenizer's prompts: each an
InputError that says what is wrong."""

from __future__ import annotations

import pytest
import torch

from vqa.decoding.generate import cross_attention_maps, generate, score_candidates
from vqa.errors import InputError


def test_empty_prompt_is_an_input_error(model, images):
    with pytest.raises(InputError, match="prompt"):
        generate(model, [[]], images[:1])
    with pytest.raises(InputError, match="prompt"):
        generate(model, [[1, 5], []], images[:2])
    with pytest.raises(InputError, match="prompt"):
        generate(model, [], images[:0])


def test_prompt_longer_than_the_maximum_is_an_input_error(model, images):
    limit = model.cfg.dec_max_len
    for n in (limit, limit + 5):
        for method in ("greedy", "beam"):
            with pytest.raises(InputError, match=f"dec_max_len={limit}"):
                generate(model, [[1] * n], images[:1], method=method, num_beams=2)
    with pytest.raises(InputError, match=f"dec_max_len={limit}"):
        score_candidates(model, [1] * (limit - 2), [[5, 6]], images=images[:1])


def test_cross_attention_maps_bad_input_is_an_input_error(model, images):
    memory = model.encode(images[:1])
    limit = model.cfg.dec_max_len
    with pytest.raises(InputError, match=f"dec_max_len={limit}"):
        cross_attention_maps(model, memory, [1] * (limit - 2), [5, 6, 7])
    with pytest.raises(InputError, match="prompt"):
        cross_attention_maps(model, memory, [], [5, 6])


def test_score_candidates_bad_input_is_an_input_error(model, images):
    with pytest.raises(InputError, match="candidates"):
        score_candidates(model, [1, 5], [], images=images[:1])
    with pytest.raises(InputError, match="prompt"):
        score_candidates(model, [], [[5]], images=images[:1])


def test_wrong_images_are_an_input_error_in_generate(model, images):
    with pytest.raises(InputError, match=r"\[B, 3, 32, 32\]"):
        generate(model, [[1, 5]], torch.randn(1, 3, 64, 64))
    with pytest.raises(InputError, match=r"\[B, 3, 32, 32\]"):
        generate(model, [[1, 5]], torch.randn(1, 1, 32, 32))
    with pytest.raises(InputError, match="2 images for 1 prompts"):
        generate(model, [[1, 5]], images[:2])
    with pytest.raises(InputError, match="images or memory"):
        generate(model, [[1, 5]])


def test_bad_generation_options_are_input_errors(model, images):
    for method in ("greedy", "beam"):
        with pytest.raises(InputError, match="max_new_tokens"):
            generate(model, [[1, 5]], images[:1], max_new_tokens=0, method=method)
    with pytest.raises(InputError, match="num_beams"):
        generate(model, [[1, 5]], images[:1], method="beam", num_beams=0)
    with pytest.raises(InputError, match="temperature"):
        generate(model, [[1, 5]], images[:1], method="sample", temperature=0.0)
    with pytest.raises(InputError, match="unknown decoding method 'nucleus'.*greedy, beam, sample"):
        generate(model, [[1, 5]], images[:1], method="nucleus")
    with pytest.raises(InputError, match="unknown GenerationConfig field.*'num_beam'.*did you mean 'num_beams'"):
        generate(model, [[1, 5]], images[:1], num_beam=2)


def test_tokenizer_prompts_empty_question_and_documented_truncation():
    from vqa.tokenizer import Tokenizer

    tok = Tokenizer.train(["a red circle above a blue square", "what colour is the circle ?", "two"], vocab_size=80)
    with pytest.raises(InputError, match="empty"):
        tok.vqa_prompt("   ")
    with pytest.raises(InputError, match="empty"):
        tok.vqa_prompt("")
    long = " ".join(["what colour is the red circle above the blue square"] * 10)
    prompt = tok.vqa_prompt(long, max_len=16)
    assert len(prompt) == 16 - 2  # documented: cut from the end, leaving room for an answer and <eos>
    assert prompt[:2] == [tok.bos_id, tok.question_id] and prompt[-1] == tok.answer_id
    assert prompt[2:-1] == tok.encode(long)[: 16 - 5]
    assert len(tok.vqa_prompt("two", max_len=16)) == 4  # a short question is left alone


def test_out_of_range_token_ids_and_image_index_are_clear_errors():
    from helpers import random_images, tiny_model

    model = tiny_model()
    images = random_images(2, model.cfg)
    with pytest.raises(InputError, match="outside the vocabulary"):
        generate(model, [[1, model.cfg.vocab_size]], images=images[:1])
    with pytest.raises(InputError, match="image_index"):
        generate(model, [[1], [1]], images=images, image_index=[0, 2])
    with pytest.raises(InputError, match="image_index"):
        generate(model, [[1], [1]], images=images, image_index=[0])


def test_bad_sampling_and_ranking_inputs_are_clear_errors():
    from helpers import random_images, tiny_model

    model = tiny_model()
    images = random_images(1, model.cfg)
    with pytest.raises(InputError, match="top_p"):
        generate(model, [[1]], images=images, method="sample", top_p=0.0)
    with pytest.raises(InputError, match="outside the vocabulary"):
        score_candidates(model, [1, 5], [[3], [model.cfg.vocab_size + 7]], images=images)
