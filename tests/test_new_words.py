"""`vqa train --new-words N`: a pretrained tokenizer gains the training text's frequent words as tokens of
their own (one token each inside a sentence, other text tokenized as before), the embedding a row each at the
mean of the word's pieces' rows (every other weight as it was, greedy answers as before at step 0), and a run
made so trains, saves, loads and answers; the values that cannot apply stop in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from data_fixtures import write_image, write_jsonl
from lm_fixtures import save_tokenizer
from test_tokenizer_bytes import random_texts, trained
from test_train import fails

import vqa
from vqa.cli import main
from vqa.config import GenerationConfig
from vqa.inference.predict import Predictor
from vqa.tokenizer import Tokenizer
from vqa.train.new_words import with_new_words
from vqa.weights import checkpoint

TOWERS = Path(vqa.__file__).parent / "weights" / "tiny"  # the tiny preset's shipped towers
TEXTS = ["A guitar near the elephant.", "Is the guitar red?", "two elephants, a guitar", "the trumpet",
         "a trumpet? a trumpet!", "an elephant, a guitar and a trumpet"]  # each new word twice or more
NEW = ("guitar", "elephant", "trumpet")


def shipped() -> Tokenizer:
    return Tokenizer.load(TOWERS)


def gpt2_like(tmp_path) -> Tokenizer:
    """A byte-level BPE like GPT-2's, as a pretrained decoder brings it."""
    save_tokenizer(tmp_path, ["what colour is the big circle?", "two blue squares left of a star"] * 5, 300)
    return Tokenizer.for_language_model(tmp_path)


def grown_with(tok: Tokenizer) -> tuple[Tokenizer, list[str]]:
    """`tok` with the three NEW words of TEXTS as tokens, as `split_words` counts and names them."""
    counts = tok.split_words(TEXTS)
    words = sorted(w for w in counts if tok.decode(tok.word_pieces(w)) in NEW)
    assert [counts[w] for w in words] == [2, 4, 4]  # elephant (not "elephants"), guitar, trumpet
    return tok.with_words(words), words


@pytest.mark.parametrize("make", ["shipped", "trained", "gpt2"])
def test_a_frequent_word_is_one_token_and_other_text_is_tokenized_as_before(make, tmp_path):
    tok = {"shipped": shipped, "trained": trained, "gpt2": lambda: gpt2_like(tmp_path)}[make]()
    assert all(len(tok.encode(w)) >= 2 for w in NEW)  # spelled in pieces before
    grown, words = grown_with(tok)
    assert grown.vocab_size == tok.vocab_size + 3
    old = tok.hf.get_vocab()  # every token keeps its id, the special ones too; the new ones come after
    assert {t: i for t, i in grown.hf.get_vocab().items() if t in old} == old
    assert sorted(grown.hf.token_to_id(w) for w in words) == list(range(tok.vocab_size, tok.vocab_size + 3))
    assert (grown.pad_id, grown.eos_id, grown.answer_id) == (tok.pad_id, tok.eos_id, tok.answer_id)
    for text in ("a guitar?", "Is the elephant red", "the trumpet, the guitar"):
        ids = grown.encode(text)
        assert sum(i >= tok.vocab_size for i in ids) == sum(text.count(w) for w in NEW), (text, ids)
        assert len(ids) < len(tok.encode(text)) and grown.decode(ids) == tok.decode(tok.encode(text))
    for text in ("guitars", "elephantine trumpeter", "(guitar)x"):  # inside a longer word: pieces, as before
        assert grown.encode(text) == tok.encode(text), text
    for text in random_texts(3, 1500):  # no new word in them: the same tokens, the same text back
        assert grown.encode(text) == tok.encode(text), text
        assert grown.decode(grown.encode(text)) == tok.decode(tok.encode(text)), text
    if make != "gpt2":  # the project's tokenizers: decode(encode(t)) == normalize(t), new words included
        for text in random_texts(4, 500) + [t + " " + x for t in TEXTS for x in random_texts(5, 3)]:
            assert grown.decode(grown.encode(text)) == grown.normalize(text), text


def test_a_word_already_a_token_is_neither_counted_nor_added():
    tok = shipped()
    with pytest.raises(Exception, match="'▁the' is already a token"):
        tok.with_words(["▁the"])
    assert "▁the" not in tok.split_words(["the the the"])  # one token already: not a candidate


def shipped_model():
    model, tok, _ = checkpoint.load(TOWERS)
    return model.eval(), tok


def test_new_rows_are_their_pieces_mean_and_every_old_weight_is_unchanged():
    model, tok = shipped_model()
    grown_tok, words = grown_with(tok)
    grown, grown_tok2 = with_new_words(model, tok, words)
    assert grown_tok2.hf.to_str() == grown_tok.hf.to_str()
    old, new = model.state_dict(), grown.state_dict()
    assert old.keys() == new.keys()
    for k, v in old.items():
        w = new[k][: v.shape[0]] if k == "decoder.embed.weight" else new[k]
        torch.testing.assert_close(w, v, rtol=0, atol=0, msg=k)
    embed = new["decoder.embed.weight"]
    assert embed.shape[0] == grown_tok.vocab_size == tok.vocab_size + 3
    for w in words:
        pieces = tok.word_pieces(w)
        assert len(pieces) >= 2
        torch.testing.assert_close(embed[grown_tok.hf.token_to_id(w)], embed[pieces].mean(0))
    assert grown.decoder.head_weight is grown.decoder.embed.weight  # the LM head grew with it (tied)


def test_at_step_0_greedy_answers_to_questions_without_the_new_words_are_as_before(shapes_dir):
    model, tok = shipped_model()
    _, words = grown_with(tok)
    grown, grown_tok = with_new_words(model, tok, words)
    pictures = sorted((shapes_dir / "val").rglob("*.png"))[:4]
    questions = ["what color is the circle?", "how many shapes are there?", "is there a square?",
                 "what shape is left of the triangle?", "what is the biggest shape?"]
    greedy = GenerationConfig(method="greedy")
    before, after = Predictor(model, tok, device="cpu"), Predictor(grown, grown_tok, device="cpu")
    for pic in pictures:
        for q in questions:
            a, b = before.answer(pic, q, generation=greedy), after.answer(pic, q, generation=greedy)
            assert (a.ids, a.answer) == (b.ids, b.answer), (pic.name, q)
        assert before.caption(pic, generation=greedy).ids == after.caption(pic, generation=greedy).ids
    # the old tokens' logits are the same numbers; each new one is its pieces' mean, below their largest
    prompt = torch.tensor([tok.vqa_prompt("what color is the circle?")])
    image = before.transform(pictures[0])[None]
    with torch.no_grad():
        lo, hi = (m.teacher_forced(image, prompt).logits[0, -1] for m in (model, grown))
    torch.testing.assert_close(hi[: tok.vocab_size], lo, rtol=1e-5, atol=1e-5)
    for w in words:
        assert hi[grown_tok.hf.token_to_id(w)] < lo[tok.word_pieces(w)].max()


def write_set(root: Path) -> Path:
    """Four pictures asked about guitars, elephants and trumpets in JSONL, train and val."""
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    for split in ("train", "val"):
        rows = []
        for i, color in enumerate(colors):
            write_image(root / "pics" / f"{split}{i}.png", (64, 64), color)
            thing = NEW[i % 3]
            rows += [{"image": f"pics/{split}{i}.png", "question": f"is it a {thing}?", "answers": [thing]},
                     {"image": f"pics/{split}{i}.png", "caption": f"a {thing} and an elephant"}]
        write_jsonl(root / f"{split}.jsonl", rows)
    return root


@pytest.mark.slow
def test_a_run_with_new_words_trains_saves_loads_and_answers(tmp_path, capsys):
    data, run = write_set(tmp_path / "data"), tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(run), "--preset", "tiny", "--batch-size", "2",
            "--eval-images", "2", "--workers", "0", "--new-words", "2", "--lr", "0"]
    assert main([*args, "--max-steps", "1"]) == 0
    model, tok, card = checkpoint.load(run / "last")
    ref_model, ref_tok = shipped_model()
    assert card["new_words"] == ["elephant", "guitar"]  # the two most frequent words spelled in pieces
    assert json.loads((run / "train_config.json").read_text())["new_words"] == 2
    assert tok.vocab_size == ref_tok.vocab_size + 2 == model.decoder.embed.weight.shape[0]
    assert len(tok.encode("a guitar")) == 2 and len(tok.encode("a trumpet")) > 2
    embed = model.decoder.embed.weight
    torch.testing.assert_close(embed[tok.encode("guitar")[0]], embed[ref_tok.encode("guitar")].mean(0))  # lr 0
    # resumed: the saved tokenizer and rows, not grown again
    assert main([*args, "--max-steps", "2", "--resume"]) == 0
    assert checkpoint.load(run / "last")[1].hf.to_str() == tok.hf.to_str()
    fails(capsys, [*args, "--max-steps", "3", "--resume", "--new-words", "3"],
          r"trained with new_words=2; it cannot change on --resume")
    pred = Predictor.from_pretrained(run, device="cpu")
    assert pred.tokenizer.hf.to_str() == tok.hf.to_str()
    assert isinstance(pred.answer(data / "pics" / "val0.png", "is it a guitar?").answer, str)
    capsys.readouterr()
    assert main(["ask", "--checkpoint", str(run), str(data / "pics" / "val1.png"), "is it an elephant?"]) == 0


def test_new_words_that_cannot_apply_stop_in_one_line(tmp_path, capsys):
    data = write_set(tmp_path / "data")

    def args(out, *extra):
        return ["train", "--data", str(data), "--out", str(tmp_path / out), "--max-steps", "1", *extra]

    fails(capsys, args("a", "--new-words", "-1"), r"--new-words must be an integer >= 0, got -1")
    fails(capsys, args("b", "--new-words", "5", "--from-scratch"),
          r"--new-words 5 cannot apply with --from-scratch: the tokenizer is then trained on the data")
    fails(capsys, args("c", "--new-words", "5", "--preset", "small"),
          r"--new-words 5 applies to a run that starts from pretrained weights.*the run trains the tokenizer")
    for out in "abc":
        assert not (tmp_path / out / "train_config.json").exists()  # stopped before the run folder was written
