"""Tests for vqa.evaluation.metrics' caption scores: ptb_tokenize against outputs of the real Java pipeline,
and caption_scores against BLEU and CIDEr-D written out from their definitions; METEOR with or without
Java, a jar that does not start or dies, each said in one line. VQA accuracy is in
test_metrics.py."""

import logging
import math
import shutil
import sys
import threading
from collections import Counter

import pytest

from vqa.errors import ExtraMissing
from vqa.evaluation.metrics import caption_scores, ptb_tokenize
from vqa.logs import get_logger


# --- ptb_tokenize (expected strings produced by the real CoreNLP 3.4.1 jar + PUNCTUATIONS filter) --
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("A man riding a wave on top of a surfboard.", "a man riding a wave on top of a surfboard"),
        ("THERE IS A BUS THAT IS PARKED ON THE STREET", "there is a bus that is parked on the street"),
        ("Don't the dogs' toys look grey?", "do n't the dogs toys look grey"),
        ("A man who can't stop and won't stop isn't Ok", "a man who ca n't stop and wo n't stop is n't ok"),
        ("It's 5 p.m. and I'm here, they'll go; we've been. You'd see!",
         "it 's 5 p.m. and i 'm here they 'll go we 've been you 'd see"),
        ("A man (in a hat) rides a bike.", "a man -lrb- in a hat -rrb- rides a bike"),
        ("The colour of St. Paul's is 3.5 and 1,000 $5 5% 10:30",
         "the colour of st. paul 's is 3.5 and 1,000 $ 5 5 % 10:30"),
        ('He said "hi" -- ok... \'quoted\' o\'clock', "he said hi ok quoted o'clock"),
        ("\u201cSmart quotes\u201d and \u2018single\u2019 ones \u2013 en dash \u2014 em dash \u2026 ellipsis",
         "smart quotes and single ones en dash em dash ellipsis"),
        ("Don\u2019t", "do n't"),
        ("A sign for Main St.", "a sign for main st."),
        ("U.S. flag e.g. a.m.", "u.s. flag e.g. a.m."),
        ("black-and-white cat/dog * [x] {y} gonna cannot",
         "black-and-white cat/dog * -lsb- x -rsb- -lcb- y -rcb- gon na can not"),
        ("It's a 10-year-old's birthday party!", "it 's a 10-year-old 's birthday party"),
        ("a bus #42 going to the airport @ 5:30pm", "a bus # 42 going to the airport @ 5:30 pm"),
        ("hello!!! what?? ?! a 3.5-inch screen", "hello !!! what ?? ?! a 3.5-inch screen"),
        ("A plate w/ food, etc.", "a plate w / food etc."),
        ("plan B. rock 'n' roll AT&T b&w", "plan b. rock 'n' roll at&t b & w"),
        ("", ""),
        (" . , ; ", ""),
    ],
)
def test_ptb_tokenize_matches_java_pipeline(raw, expected):
    assert ptb_tokenize(raw) == expected


def test_ptb_tokenize_replaces_newlines():
    assert ptb_tokenize("a dog\non a bed.") == "a dog on a bed"


# --- caption_scores ----------------------------------------------------------------------------
REFS = {
    1: ["A man riding a wave on top of a surfboard.", "A surfer rides a large wave in the ocean."],
    2: ["Two dogs playing with a frisbee in the grass.", "A pair of dogs play on the lawn."],
    "img3": ["A red double-decker bus on the street.", "A bus parked by the curb."],
}
PREDS = {1: "A man rides a wave on a surfboard.", 2: "Two dogs play in the grass", "img3": "A red bus."}


def _ngrams(words: list[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def _bleu_by_the_formula(preds: dict, refs: dict) -> list[float]:
    """Corpus BLEU-1..4 from Papineni et al.'s definition, written out here (not the scorer under test):
    clipped n-gram matches summed over the corpus, divided by the hypothesis n-grams, geometric mean up to
    n, times the brevity penalty against the closest reference length of each hypothesis (ties: the shorter)."""
    hyps = {k: ptb_tokenize(v).split() for k, v in preds.items()}
    rs = {k: [ptb_tokenize(c).split() for c in v] for k, v in refs.items()}
    hyp_len = sum(len(h) for h in hyps.values())
    ref_len = sum(min((len(r) for r in rs[k]), key=lambda n: (abs(n - len(hyps[k])), n)) for k in hyps)
    out, log_p = [], 0.0
    for n in range(1, 5):
        match = guess = 0
        for k, h in hyps.items():
            counts = _ngrams(h, n)
            best = Counter()
            for r in rs[k]:
                best |= _ngrams(r, n)
            match += sum(min(c, best[g]) for g, c in counts.items())
            guess += max(len(h) - n + 1, 0)
        log_p += math.log((match + 1e-15) / (guess + 1e-9))  # the COCO scorer's guard against log(0)
        bp = min(1.0, math.exp(1 - ref_len / hyp_len))
        out.append(bp * math.exp(log_p / n))
    return out


def _cider_d_by_the_formula(preds: dict, refs: dict, sigma: float = 6.0) -> float:
    """CIDEr-D (Vedantam et al. 2015, the COCO server's variant) written out here: tf-idf n-gram vectors
    with idf = log(#images / #images whose references hold the n-gram), the hypothesis' weights clipped by
    the reference's, a Gaussian penalty on the length difference (in bigrams, as the server counts),
    averaged over n = 1..4 and the references, x 10."""
    hyps = {k: ptb_tokenize(v).split() for k, v in preds.items()}
    rs = {k: [ptb_tokenize(c).split() for c in v] for k, v in refs.items()}
    df = Counter()
    for k in rs:
        df.update({g for r in rs[k] for n in range(1, 5) for g in _ngrams(r, n)})
    log_images = math.log(len(rs))

    def vec(words):
        v = [{g: c * (log_images - math.log(max(1.0, df[g]))) for g, c in _ngrams(words, n).items()}
             for n in range(1, 5)]
        norms = [math.sqrt(sum(x * x for x in d.values())) for d in v]
        return v, norms, max(len(words) - 1, 0)

    total = 0.0
    for k, h in hyps.items():
        hv, hn, hl = vec(h)
        per_ref = []
        for r in rs[k]:
            rv, rn, rl = vec(r)
            score = 0.0
            for n in range(4):
                dot = sum(min(x, rv[n].get(g, 0.0)) * rv[n].get(g, 0.0) for g, x in hv[n].items())
                if hn[n] and rn[n]:
                    score += dot / (hn[n] * rn[n]) * math.exp(-((hl - rl) ** 2) / (2 * sigma**2))
            per_ref.append(score / 4 * 10)
        total += sum(per_ref) / len(per_ref)
    return total / len(hyps)


def test_caption_scores_equal_the_metrics_definitions():
    s = caption_scores(PREDS, REFS)
    assert [s[f"BLEU-{n}"] for n in range(1, 5)] == pytest.approx(_bleu_by_the_formula(PREDS, REFS), abs=1e-6)
    assert s["CIDEr-D"] == pytest.approx(_cider_d_by_the_formula(PREDS, REFS), abs=1e-9)
    assert 0 < s["BLEU-4"] < s["BLEU-1"] < 1 and s["CIDEr-D"] > 0


def test_caption_bleu_1_by_hand():
    # "a cat" vs "a cat sat": unigram precision 1, brevity penalty exp(1 - 3/2); the trailing period
    # and capitals go away in tokenization.
    s = caption_scores({0: "A cat."}, {0: ["a cat sat"]})
    assert s["BLEU-1"] == pytest.approx(math.exp(-0.5), rel=1e-6)


def test_identical_captions_score_perfectly():
    refs = {k: [v[0]] for k, v in REFS.items()}
    s = caption_scores({k: v[0] for k, v in refs.items()}, refs)
    assert s["BLEU-4"] == pytest.approx(1.0, abs=1e-6)
    assert s["CIDEr-D"] == pytest.approx(10.0)  # perfect cosine, no length penalty, x10


def test_empty_prediction_scores_zero_without_crashing():
    s = caption_scores({1: ""}, {1: ["a dog on a bed"]})
    assert all(v == 0.0 for v in s.values())
    s = caption_scores({1: "...", 2: ""}, {1: ["."], 2: ["!"]})  # nothing left after tokenization
    assert all(v == 0.0 for v in s.values())
    corpus = caption_scores({**PREDS, 2: ""}, REFS)
    assert 0 < corpus["CIDEr-D"] < caption_scores(PREDS, REFS)["CIDEr-D"]


def test_mismatched_image_ids_are_named():
    with pytest.raises(ValueError, match=r"no prediction for image id\(s\) 2.*no references for image id\(s\) 7"):
        caption_scores({1: "a", 7: "b"}, {1: ["a"], 2: ["b"]})
    with pytest.raises(ValueError, match=r"and 2 more"):
        caption_scores({}, {i: ["a"] for i in range(7)})


def test_bad_references_are_errors():
    with pytest.raises(ValueError, match="non-empty list"):
        caption_scores({1: "a dog"}, {1: []})
    with pytest.raises(ValueError, match="non-empty list"):
        caption_scores({1: "a dog"}, {1: "a dog"})
    with pytest.raises(ValueError):
        caption_scores({}, {})


# --- cases the mutation run (make mutation) showed unchecked -------------------------------------
def test_mismatched_image_ids_are_listed_exactly():
    # only references missing: no word about predictions; ids sorted as strings, five shown, the rest counted
    with pytest.raises(ValueError) as e:
        caption_scores({1: "a", 7: "b"}, {1: ["a"]})
    assert str(e.value) == "caption_scores: no references for image id(s) 7"
    with pytest.raises(ValueError) as e:
        caption_scores({1: "a"}, {1: ["a"], 2: ["b"]})
    assert str(e.value) == "caption_scores: no prediction for image id(s) 2"
    with pytest.raises(ValueError) as e:
        caption_scores({1: "a", 7: "b"}, {1: ["a"], 2: ["b"]})
    assert str(e.value) == "caption_scores: no prediction for image id(s) 2; no references for image id(s) 7"
    with pytest.raises(ValueError) as e:
        caption_scores({}, {i: ["a"] for i in range(9, 14)})  # five: all shown
    assert str(e.value) == "caption_scores: no prediction for image id(s) 10, 11, 12, 13, 9"
    with pytest.raises(ValueError) as e:
        caption_scores({}, {i: ["a"] for i in range(9, 15)})  # six: five and a count
    assert str(e.value) == "caption_scores: no prediction for image id(s) 10, 11, 12, 13, 14 (and 1 more)"


def test_caption_scores_print_nothing(capsys):
    caption_scores(PREDS, REFS)
    assert capsys.readouterr().out == ""  # pycocoevalcap's Bleu prints its counts unless verbose=0


@pytest.mark.parametrize("raw, expected", [
    # PTBTokenizer's rules (CoreNLP 3.4.1) as the module docstring lists them
    ("gotta wanna lemme gimme GOTTA", "got ta wan na lem me gim me got ta"),
    ("shouldn't've", "should n't 've"),  # two clitics, in order
    ("n't", "n't"),  # a clitic alone is one token
    ("rock'n'roll y'know Y'all rock'n'roll's", "rock 'n' roll y' know y' all rock 'n' roll 's"),
    ("nice :) ;-) :( bye", "nice :-rrb- ;--rrb- :-lrb- bye"),
    ("a 5 7/8 inch pipe", "a 5\xa07/8 inch pipe"),  # Java joins a fraction with a no-break space
    ("AT&amp;T and b&amp;w", "at&t and b & w"),
    ("plan J.\nSmith", "plan j. smith"),  # a newline is a space: "J." stays an initial
])
def test_ptb_tokenize_rules(raw, expected):
    assert ptb_tokenize(raw) == expected


# --- METEOR and ROUGE-L (paper=True) ----------------------------------------------------------------
def test_rouge_l_by_hand():
    pytest.importorskip("pycocoevalcap")
    from vqa.evaluation import metrics

    # image 1: LCS("a red circle", "a big red circle") = 3: precision 1, recall 3/4 (the best over both
    # references); F = (1 + 1.2^2) P R / (R + 1.2^2 P) = 2.44 x 0.75 / 2.19. Image 2: identical, 1.
    got = metrics.caption_scores({1: "a red circle", 2: "two blue squares"},
                                 {1: ["a big red circle", "a red circle on gray"], 2: ["two blue squares"]},
                                 paper=True)
    assert got["ROUGE-L"] == pytest.approx((2.44 * 0.75 / 2.19 + 1.0) / 2)
    assert "ROUGE-L" not in metrics.caption_scores({1: "a red circle"}, {1: ["a red circle"]})


@pytest.fixture
def eval_lines():
    """The lines `vqa eval`'s logger writes, however vqa's logging is set up (it passes nothing on by default)."""
    records = []
    catch = logging.Handler(logging.WARNING)
    catch.emit = records.append
    get_logger("eval").addHandler(catch)
    yield records
    get_logger("eval").removeHandler(catch)


def test_without_java_meteor_is_left_out_in_one_line(monkeypatch, eval_lines):
    pytest.importorskip("pycocoevalcap")
    from vqa.evaluation import metrics

    monkeypatch.setattr(metrics.shutil, "which", lambda name: None)
    got = metrics.caption_scores({1: "a red circle"}, {1: ["a red circle", "a big red circle"]}, paper=True)
    assert "METEOR" not in got and {"BLEU-4", "ROUGE-L", "CIDEr-D"} <= set(got)
    assert [r.getMessage() for r in eval_lines] == [
        "vqa eval: METEOR needs Java (no 'java' on PATH); the other caption scores are written"]


def test_a_java_that_does_not_start_leaves_meteor_out_in_one_line(monkeypatch, eval_lines):
    pytest.importorskip("pycocoevalcap")
    from pycocoevalcap.meteor import meteor as jar

    from vqa.evaluation import metrics

    def refuse():
        raise OSError("Cannot allocate memory")

    monkeypatch.setattr(metrics.shutil, "which", lambda name: "/usr/bin/java")
    monkeypatch.setattr(jar, "Meteor", refuse)
    assert metrics.start_meteor() is None
    assert [r.getMessage() for r in eval_lines] == ["vqa eval: METEOR's Java process did not start (Cannot allocate "
                                                    "memory); the other caption scores are written"]


def test_a_meteor_process_that_dies_is_stopped_and_named_in_one_line(eval_lines):
    """The jar answers nothing (it died): its process is killed, the lock compute_score held is released (the
    scorer's __del__ takes it again), no METEOR, one line."""
    from vqa.evaluation import metrics

    class Dead:
        lock = threading.Lock()
        killed = False

        class meteor_p:  # noqa: N801 (pycocoevalcap's attribute)
            @staticmethod
            def kill():
                Dead.killed = True

        def compute_score(self, gts, res):
            self.lock.acquire()
            raise ValueError("could not convert string to float: ''")

    assert metrics.meteor_score(Dead(), {1: ["a"]}, {1: ["a"]}) is None
    assert Dead.killed and not Dead.lock.locked()
    assert [r.getMessage() for r in eval_lines] == ["vqa eval: METEOR's Java process failed (could not convert string "
                                                    "to float: ''); the other caption scores are written"]


def test_with_java_meteor_is_scored(monkeypatch):
    pytest.importorskip("pycocoevalcap")
    from vqa.evaluation import metrics

    if shutil.which("java") is None:  # not metrics.java(): the test is of what it looks for
        pytest.skip("no Java here")
    found = []
    monkeypatch.setattr(metrics.shutil, "which", lambda name: found.append(name) or "/usr/bin/java")
    refs = {1: ["a red circle on a gray background"], 2: ["two blue squares"]}
    same = metrics.caption_scores({1: "a red circle on a gray background", 2: "two blue squares"}, refs, paper=True)
    other = metrics.caption_scores({1: "a green triangle", 2: "two blue squares"}, refs, paper=True)
    assert found == ["java", "java"]
    # identical captions: METEOR's fragmentation penalty alone (one chunk) keeps it just under 1
    assert 0.9 < same["METEOR"] <= 1.0 and other["METEOR"] < same["METEOR"] - 0.2


class _FixedMeteor:
    """A started METEOR scorer as `start_meteor` returns one, whose corpus score is fixed."""

    def compute_score(self, gts, res):
        return 0.375, [0.375] * len(res)


def test_a_started_meteor_scorer_is_used_and_false_means_none():
    """`vqa eval` starts METEOR before decoding and hands it over: caption_scores scores with that one and
    starts no other; meteor=False (its absence already said) scores without it."""
    pytest.importorskip("pycocoevalcap")
    refs = {1: ["a red circle"], 2: ["two blue squares"]}
    preds = {1: "a red circle", 2: "two squares"}
    assert caption_scores(preds, refs, paper=True, meteor=_FixedMeteor())["METEOR"] == 0.375
    assert "METEOR" not in caption_scores(preds, refs, paper=True, meteor=False)


def test_scoring_captions_without_the_eval_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocoevalcap.bleu.bleu", None)  # what an uninstalled package imports as
    with pytest.raises(ExtraMissing) as e:
        caption_scores({1: "a red circle"}, {1: ["a red circle"]})
    assert str(e.value) == ("scoring captions (BLEU-4, CIDEr-D) needs the 'eval' extra (pycocoevalcap.bleu.bleu is "
                            "not installed): pip install 'vqa[eval]'")
