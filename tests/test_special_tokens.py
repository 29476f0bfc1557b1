"""Generation never produces a special token but <eos>: the tokenizer says which (`never_generated`: <pad>, <bos>,
<unk>, the task markers, a language model's own <|endoftext|>), and every method skips them -- greedy, beam,
sampling, the compiled step, a padded batch, the Predictor and the ONNX runtime -- while the textbook properties
keep holding with them banned (cached == uncached, beam size 1 == greedy, padded batch == one by one) and
scores stay the model's own log-probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from generate_fixtures import ref_greedy
from helpers import lively_model, random_images, tiny_config, tiny_model
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from vqa.decoding.generate import generate
from vqa.errors import InputError
from vqa.model import VQAModel
from vqa.tokenizer import ANSWER, BOS, CAPTION, EOS, PAD, QUESTION, UNK, Tokenizer

TEXTS = ["what color is the circle?", "a red circle", "a blue square", "yes", "no", "red", "blue"] * 4
# the project's tokenizer: <pad> 0, <bos> 1, <eos> 2, <unk> 3, <caption> 4, <question> 5, <answer> 6
SPECIAL = frozenset({0, 1, 3, 4, 5, 6})
CAPTION_PROMPT = [1, 4]  # <bos> <caption>


# ------------------------------------------------------------------------------------------------ the tokenizers


def _gpt2_like(folder) -> None:
    """A byte-level BPE with GPT-2's one special token, as tests/lm_fixtures.py makes (no weights needed)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))


def test_never_generated_is_every_special_token_but_eos_in_each_kind_of_tokenizer(tmp_path):
    own = Tokenizer.train(TEXTS, vocab_size=80)
    assert own.never_generated == SPECIAL and own.eos_id == 2
    # a pretrained decoder's (dec_pretrained): vqa's tokens added after GPT-2's, and GPT-2's <|endoftext|> too
    _gpt2_like(tmp_path / "lm")
    lm = Tokenizer.for_language_model(tmp_path / "lm")
    end = lm.hf.token_to_id("<|endoftext|>")
    want = {lm.hf.token_to_id(t) for t in (PAD, BOS, UNK, CAPTION, QUESTION, ANSWER)} | {end}
    assert lm.never_generated == want and lm.eos_id not in want and lm.eos_id != end
    # an imported captioner's: <|endoftext|> is its <eos> (and pad, bos, unk): nothing else to ban, until the
    # VQA prompt's tokens are added
    captioner = Tokenizer(HFTokenizer.from_file(str(tmp_path / "lm" / "tokenizer.json")))
    assert captioner.eos_id == end and captioner.never_generated == frozenset()
    grown = captioner.with_prompt_tokens()
    assert grown.never_generated == {grown.question_id, grown.answer_id}
    assert lm.hf.token_to_id(EOS) == lm.eos_id


# ------------------------------------------------------------------------------------------------ generate


def test_a_fresh_model_repeats_the_task_marker_unless_it_is_banned():
    """The reviewer's case: an untrained model repeats its last token, <caption>, which decodes to nothing."""
    model = tiny_model()
    images = random_images(1, model.cfg)
    free = generate(model, [CAPTION_PROMPT], images, max_new_tokens=8).sequences[0]
    assert free and set(free) == {4}  # what generate does without being told what is special
    for method, extra in (("greedy", {}), ("beam", dict(num_beams=3)), ("sample", dict(seed=0))):
        out = generate(model, [CAPTION_PROMPT], images, max_new_tokens=8, method=method, banned=SPECIAL,
                       min_new_tokens=1, **extra)
        seqs = [s for s, _ in out.beams[0]] if out.beams else out.sequences
        assert all(not set(s) & SPECIAL for s in seqs), (method, seqs)
        assert out.sequences[0], method  # something else was said


@pytest.fixture(scope="module")
def lively():
    """The lively model of tests/test_generate.py and three prompts of different lengths, with the tokens its
    greedy decoding likes most banned: the ban changes what it says."""
    model = lively_model(eos_id=3)
    prompts = [[1, 5], [1, 7, 8, 9, 10, 11], [1, 12, 13, 14]]
    images = random_images(len(prompts), model.cfg)
    free = generate(model, prompts, images, max_new_tokens=10).sequences
    counts = torch.bincount(torch.as_tensor([t for s in free for t in s]), minlength=model.cfg.vocab_size)
    banned = frozenset(int(i) for i in counts.topk(3).indices if counts[i] > 0) | {0, 1}
    assert banned - {0, 1}, free
    return model, prompts, images, banned, free


def test_cached_greedy_with_banned_tokens_equals_the_uncached_reference(lively):
    model, prompts, images, banned, free = lively
    out = generate(model, prompts, images, max_new_tokens=10, banned=banned, min_new_tokens=1)
    assert out.sequences != free
    for i, prompt in enumerate(prompts):
        seq, score = ref_greedy(model, images[i : i + 1], prompt, 10, banned, min_new=1)
        assert out.sequences[i] == seq and not set(seq) & banned and seq
        assert out.scores[i] == pytest.approx(score, abs=1e-4)  # the model's log-probability, not renormalized


def test_beam_of_one_is_greedy_and_a_padded_batch_is_its_prompts_one_by_one_with_bans(lively):
    model, prompts, images, banned, _ = lively
    greedy = generate(model, prompts, images, max_new_tokens=10, banned=banned)
    one = generate(model, prompts, images, max_new_tokens=10, banned=banned, method="beam", num_beams=1,
                   length_penalty=0.0)
    assert one.sequences == greedy.sequences
    assert one.scores == pytest.approx(greedy.scores, abs=1e-4)
    for k in (1, 3):
        batch = generate(model, prompts, images, max_new_tokens=10, banned=banned, method="beam", num_beams=k)
        for i, prompt in enumerate(prompts):
            alone = generate(model, [prompt], images[i : i + 1], max_new_tokens=10, banned=banned, method="beam",
                             num_beams=k)
            assert [s for s, _ in alone.beams[0]] == [s for s, _ in batch.beams[i]]
            assert [x for _, x in alone.beams[0]] == pytest.approx([x for _, x in batch.beams[i]], abs=1e-4)
            assert all(not set(s) & banned for s, _ in batch.beams[i])


def test_beam_scores_are_the_models_log_likelihoods_and_samples_avoid_the_bans(lively):
    model, prompts, images, banned, _ = lively
    out = generate(model, prompts, images, max_new_tokens=6, banned=banned, method="beam", num_beams=3)
    for i, prompt in enumerate(prompts):
        for seq, score in out.beams[i]:
            full = prompt + seq + [model.cfg.eos_id]
            with torch.no_grad():
                logits = model.teacher_forced(images[i : i + 1], torch.as_tensor([full])).logits
                logp = logits[0].float().log_softmax(-1)
            ref = sum(float(logp[t - 1, full[t]]) for t in range(len(prompt), len(full)))
            if len(seq) < 6:  # ended at <eos> (beams cut by the budget score without it)
                assert score == pytest.approx(ref, abs=1e-4)
    for seed in range(5):
        hot = generate(model, prompts, images, max_new_tokens=10, banned=banned, method="sample", temperature=3.0,
                       seed=seed)
        assert all(not set(s) & banned for s in hot.sequences)


def test_the_compiled_step_bans_as_the_eager_one(lively, quick_compile):
    model, prompts, images, banned, _ = lively
    eager = generate(model, prompts, images, max_new_tokens=6, banned=banned)
    compiled = generate(model, prompts, images, max_new_tokens=6, banned=banned, compile=True)
    assert compiled.sequences == eager.sequences
    assert compiled.scores == pytest.approx(eager.scores, abs=1e-4)


def test_bad_bans_are_input_errors_and_a_vocabulary_drops_the_banned_tokens(lively):
    model, prompts, images, _, _ = lively
    eos = model.cfg.eos_id
    with pytest.raises(InputError, match="<eos>.*cannot be banned"):
        generate(model, prompts, images, banned={eos})
    with pytest.raises(InputError, match="outside the vocabulary"):
        generate(model, prompts, images, banned={model.cfg.vocab_size})
    out = generate(model, prompts, images, max_new_tokens=6, vocab=[5, 7, 8, eos], banned={5, 7},
                   min_new_tokens=1)
    assert all(s and set(s) <= {8} for s in out.sequences)
    with pytest.raises(InputError, match="no token but <eos>"):
        generate(model, prompts, images, vocab=[5, eos], banned={5}, min_new_tokens=1)


# ------------------------------------------------------------------------------------------------ the Predictor


@pytest.fixture(scope="module")
def fresh_pred():
    """An untrained model with a real tokenizer: what `vqa train --max-steps 3` gives."""
    from vqa.inference.predict import Predictor

    tok = Tokenizer.train(TEXTS, vocab_size=80)
    torch.manual_seed(0)
    return Predictor(VQAModel(tiny_config(**tok.model_ids())), tok, device="cpu", compile=False)


def test_an_untrained_models_captions_and_answers_hold_no_special_token_and_are_never_empty(fresh_pred):
    img = np.full((20, 30, 3), 128, dtype=np.uint8)
    special = fresh_pred.tokenizer.special_ids
    for kw in ({}, dict(method="beam", num_beams=3), dict(method="sample", seed=1)):
        cap = fresh_pred.caption(img, **kw)
        assert cap.ids and not set(cap.ids) & special and cap.caption, kw
        assert all(c for c, _ in cap.beams)
    res = fresh_pred.answer(img, "what color is the circle?", top_k=3)
    assert res.answer and all(a for a, _ in res.top_k)
    assert not set(res.ids) & special


def test_an_answer_vocab_limits_tokens_not_answers_and_never_gives_an_empty_answer(fresh_pred, monkeypatch):
    """The reviewer's case: Predictor(answer_vocab=["yes", "no"]) answered '' with p=0.67."""
    from vqa.inference.predict import Predictor

    tok = fresh_pred.tokenizer
    pred = Predictor(fresh_pred.model, tok, device="cpu", compile=False, answer_vocab=["yes", "no"])
    allowed = {*tok.encode("yes"), *tok.encode("no")}
    assert set(pred.answer_vocab) == allowed | {tok.eos_id}
    res = pred.answer(np.zeros((16, 16, 3), np.uint8), "what color is the circle?", top_k=3)
    assert res.answer and all(a for a, _ in res.top_k)
    assert all(set(tok.encode(a)) <= allowed for a, _ in res.top_k)  # any sequence of those tokens
    monkeypatch.setattr(tok, "encode", lambda text: [tok.unk_id])  # text of characters it does not know
    with pytest.raises(InputError, match="no.*token the model can generate"):
        pred.set_answer_vocab(["\u00bf\u00bf"])


# ------------------------------------------------------------------------------------------------ the ONNX runtime


def test_the_onnx_runtimes_greedy_bans_what_generate_bans():
    """OnnxPredictor.greedy's choice, with a decoder step that always prefers a task marker then <eos>."""
    from vqa.export.runtime import OnnxPredictor

    tok = Tokenizer.train(TEXTS, vocab_size=80)
    p = object.__new__(OnnxPredictor)
    p.tokenizer, p.eos, p.pad, p.max_len = tok, tok.eos_id, tok.pad_id, 12
    p.layers, p.heads, p.head_dim = 1, 1, 2
    p.never_generated = sorted(tok.never_generated)
    v = tok.vocab_size
    word = tok.encode("red")[0]

    def step(ids, positions, key_mask, past_k, past_v, mk, mv):
        logits = np.zeros((ids.shape[0], ids.shape[1], v), dtype=np.float32)
        logits[..., tok.caption_id], logits[..., tok.eos_id], logits[..., word] = 9.0, 8.0, 7.0
        grown = np.zeros((1, ids.shape[0], 1, past_k.shape[3] + ids.shape[1], 2), dtype=np.float32)
        return logits, grown, grown

    p.step = step
    seen = []
    out = p.greedy([tok.caption_prompt()], None, None, max_new_tokens=4, min_new_tokens=1,
                   on_logits=lambda t, x: seen.append(x))
    assert out == [[word]]  # not <caption>; not <eos> first; then <eos>
    assert int(seen[0].argmax()) == tok.caption_id  # on_logits sees the model's logits as they are
    assert p.greedy([tok.caption_prompt()], None, None, max_new_tokens=4) == [[]]  # <eos> first when allowed
