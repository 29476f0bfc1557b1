"""Evaluation metrics: VQA accuracy (official VQA v2 rules; TextVQA's, VizWiz's and GQA's are in
`answer_rules`) and caption BLEU-1..4 / METEOR / ROUGE-L / CIDEr-D.

VQA accuracy
    A port of the official evaluation code, GT-Vision-Lab/VQA,
    ``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` as it stands after its 2021 fix (BSD licence,
    (c) 2014 Aishwarya Agrawal). Per question: the prediction and the ground-truth answers get
    ``\\n``/``\\t`` replaced by spaces and are stripped; ONLY if the ground-truth answers disagree
    (``len(set(gts)) > 1``) are all of them, prediction included, put through ``processPunctuation``
    and ``processDigitArticle`` (:func:`normalize_answer`); the score is the mean over the
    leave-one-annotator-out subsets of ``min(1, #matches among the others / 3)``, with exact string
    comparison. So when all annotators agree, "Yes", "yes." or "two" do not match "yes"/"2" (the
    official behaviour). Older copies (LAVIS, pre-2021 GT-Vision-Lab) always normalize the
    prediction and never digit/article-normalize the answers; this module does not follow them.

Caption metrics
    BLEU-1..4 and CIDEr-D are pycocoevalcap's own ``Bleu(4)`` and ``Cider()`` scorers (the Cider
    class is the CIDEr-D of the COCO evaluation server: sigma=6 length penalty, clipped counts,
    x10), fed the same tokenized dicts the official ``COCOEvalCap`` builds. BLEU is in 0..1, CIDEr-D
    in 0..10 (1.0 is what papers print as "100"). With ``paper=True``, METEOR and ROUGE-L join them, the
    table every captioning paper prints: pycocoevalcap's ``Meteor()`` (METEOR 1.5, ``-l en -norm``, run
    by its jar under Java) and ``Rouge()`` (ROUGE-L: the longest common subsequence's F-measure with
    beta=1.2, best precision and best recall over the references, averaged over images). Without a
    ``java`` on PATH, one warning line says so and the other scores are returned.

Tokenization (:func:`ptb_tokenize`)
    The official pipeline (pycocoevalcap ``tokenizer/ptbtokenizer.py``) runs Stanford CoreNLP
    3.4.1's ``PTBTokenizer -preserveLines -lowerCase`` in Java, then drops the tokens in
    ``PUNCTUATIONS``. Java is not available here, so this is a pure-Python re-implementation of that
    pipeline for ordinary English captions, checked token for token against the real 3.4.1 jar:
    lower-cased; punctuation split off words; clitics split ("don't" -> "do n't", "it's" -> "it 's",
    "can't" -> "ca n't", "cannot" -> "can not", "gonna" -> "gon na"); hyphenated words, numbers
    ("1,000", "3.5", "10:30"), "cat/dog", "AT&T", "#tag", acronyms ("u.s.", "p.m."), initials
    ("B. ") and the usual abbreviations ("st.", "mr.", "etc.") kept whole; "$5" -> "$ 5",
    "5%" -> "5 %", "£" -> "#", "€" -> "$", "¢" -> "cents"; quotes, dashes, ellipses, "." "," ";" ":"
    and single "?"/"!" removed ("!!!" and "?!" are kept, as in Java). As in the official output, brackets survive as
    "-lrb-", "-rrb-", "-lsb-", "-rsb-", "-lcb-", "-rcb-": Java lower-cases "-LRB-" before the
    case-sensitive PUNCTUATIONS filter. No British->American respelling (the 3.4.1 command line does
    none: "colour" stays). During development the output was compared with the real jar (run under
    a JRE) on ~6,300 caption-like sentences with quotes, clitics, numbers, abbreviations, brackets
    and unicode punctuation: all identical but one ("US$5"). Known differences, all rare in
    captions: currency prefixes ("US$"), abbreviations missing from the list below, apostrophes in
    odd places ("n'tn't"), "&"/"@"/"$" glued inside lower-case words ("a&b", "tv$"), emoticons
    other than ":)"-style, SGML/XML markup and entities other than "&amp;", and characters Java
    deletes as untokenizable.
"""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ExtraMissing
from ..logs import get_logger

# --- official VQA normalization tables (vqaEval.py, reproduced exactly) ---------------------------
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's",
    "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm",
    "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll",
    "let's": "let's", "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've",
    "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've",
    "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't", "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd", "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've", "somebodyll": "somebody'll", "somebodys": "somebody's",
    "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've",
    "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas",
    "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't",
    "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll",
    "whyre": "why're", "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've",
    "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're",
    "youve": "you've",
}
MANUAL_MAP = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
              "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ["a", "an", "the"]
# Both regexes verbatim, quirks included: "(?!<=\d)" is a lookahead, not a lookbehind, so a period
# survives only when a digit follows it ("3.5" stays, "5." and "yes." lose it).
PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
COMMA_STRIP = re.compile(r"(\d)(\,)(\d)")
PUNCT = [";", r"/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]


def process_punctuation(text: str) -> str:
    """The official ``processPunctuation``: each PUNCT character is deleted if it touches a space
    (or the text has a digit,digit comma anywhere), else replaced by a space; then PERIOD_STRIP."""
    out = text
    for p in PUNCT:
        if (p + " " in text or " " + p in text) or COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    # The official call passes re.UNICODE positionally, i.e. as count=32 (at most 32 periods removed).
    return PERIOD_STRIP.sub("", out, count=int(re.UNICODE))


def process_digit_article(text: str) -> str:
    """The official ``processDigitArticle``: lower-case, split on whitespace, number words -> digits
    (MANUAL_MAP), drop articles, then map CONTRACTIONS; words joined by single spaces."""
    words = [MANUAL_MAP.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def normalize_answer(text: str) -> str:
    """The official answer normalization chain: ``processDigitArticle(processPunctuation(text))``."""
    return process_digit_article(process_punctuation(text))


def _clean(text: str) -> str:
    return text.replace("\n", " ").replace("\t", " ").strip()


def vqa_accuracy(prediction: str, answers: list[str]) -> float:
    """VQA accuracy (0..1) of one prediction against its ground-truth answers, official v2 rules.

    With the usual 10 answers: 1.0 when >= 4 annotators gave the answer, 0.9 for 3, 0.6 for 2,
    0.3 for 1. Users' own data often has fewer: with n < 10 answers the leave-one-out formula would
    score a single answer at 0 forever, so there (our choice, not the official code's, which assumes 10)
    accuracy is min(1, matches / min(3, n)) with the same normalization: one answer means exact match,
    three or more need three matches for full credit. Raises ValueError for no answers."""
    check_answers(answers, "vqa_accuracy")
    gts = [_clean(a) for a in answers]
    pred = _clean(prediction)
    if len(set(gts)) > 1:
        gts = [normalize_answer(a) for a in gts]
        pred = normalize_answer(pred)
    return consensus(pred, gts)


def check_answers(answers: list[str], who: str) -> None:
    if isinstance(answers, str) or not answers:
        raise ValueError(f"{who} needs a non-empty list of ground-truth answers")


def consensus(prediction: str, answers: list[str]) -> float:
    """The mean over leave-one-annotator-out subsets of min(1, matches / 3) (ten answers; fewer: as vqa_accuracy)."""
    matches = sum(a == prediction for a in answers)
    if len(answers) < 10:
        return min(1.0, matches / min(3, len(answers)))
    # Leaving out annotator i leaves `matches - [answers[i] == prediction]` matching answers among the others.
    return sum(min(1.0, (matches - (a == prediction)) / 3.0) for a in answers) / len(answers)


def _answer_strings(answers) -> list[str]:
    return [a["answer"] if isinstance(a, Mapping) else a for a in answers]


def vqa_scores(predictions: Mapping, records, ndigits: int = 2, accuracy: Callable | Mapping = vqa_accuracy) -> dict:
    """Official-style VQA summary: percentages rounded to ``ndigits`` (2, as in vqaEval.setAccuracy).
    ``accuracy``: the per-question score (VQA v2's), or {question_id: score function}
    (`answer_rules.score_answers`: each benchmark's own).

    ``records`` have ``question_id``, ``answers`` (strings, or VQA-style dicts with "answer"),
    ``answer_type`` and ``question_type`` (a record whose type is "" or None is left out of that
    breakdown). Every record needs a prediction (ValueError naming the first few missing ids);
    predictions for other questions are ignored. Returns ``{"overall", "per_answer_type",
    "per_question_type", "per_question", "count"}``."""
    records = list(records)
    if not records:
        raise ValueError("vqa_scores needs at least one record")
    missing = [r.question_id for r in records if r.question_id not in predictions]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} question(s), e.g. question_id {missing[:5]}")
    accs, per_question, by_answer, by_question = [], {}, defaultdict(list), defaultdict(list)
    for r in records:
        score = accuracy[r.question_id] if isinstance(accuracy, Mapping) else accuracy
        acc = score(predictions[r.question_id], _answer_strings(r.answers))
        accs.append(acc)
        per_question[r.question_id] = acc
        if getattr(r, "answer_type", None):
            by_answer[r.answer_type].append(acc)
        if getattr(r, "question_type", None):
            by_question[r.question_type].append(acc)

    def pct(values):
        return round(100.0 * sum(values) / len(values), ndigits)

    return {"overall": pct(accs),
            "per_answer_type": {k: pct(v) for k, v in by_answer.items()},
            "per_question_type": {k: pct(v) for k, v in by_question.items()},
            "per_question": {k: round(100.0 * v, ndigits) for k, v in per_question.items()},
            "count": len(records)}


# --- caption tokenization (COCO PTBTokenizer pipeline, see module docstring) ----------------------
PUNCTUATIONS = ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                ".", "?", "!", ",", ":", "-", "--", "...", ";"]  # pycocoevalcap ptbtokenizer.py, verbatim
_CHAR_MAP = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
                           "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u2013": " -- ", "\u2014": " -- ",
                           "\u2015": " -- ", "\u2026": " ... ", "\u00a3": "#", "\u20ac": "$", "\u00a2": " cents ",
                           "\u00bd": "1/2", "\u00bc": "1/4", "\u00be": "3/4"})
_ABBREVS = ("mr|mrs|ms|messrs|dr|prof|rev|gov|sen|rep|gen|col|lt|sgt|capt|cmdr|adm|maj|sr|jr|st|mt|ft|ave|rd"
            "|blvd|vs|etc|inc|ltd|co|corp|bros|dept|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|ph|esq|sq"
            "|ct|pres|supt|hon|pvt|cpl|ste|cie|mon|tue|wed|thu|fri|univ|assn|est|tel|cf|al|ala|ariz|calif"
            "|conn|fla|mich|minn|tex|tenn|nev|okla|penn|va|md|mo|wis|wyo|colo|ga|ky|neb")
_TOKEN = re.compile(
    r"(?P<keep>(?:https?://|www\.)[^\s\"()\[\]{}<>]*[^\s\"()\[\]{}<>.,;:!?']"  # URL
    r"|[\w.+-]+@\w[\w-]*(?:\.[\w-]+)+"  # e-mail address
    r"|(?:[A-Za-z]\.){2,}(?!\w)"  # acronym: u.s. e.g. p.m.
    rf"|(?i:{_ABBREVS})\.(?!\w)|(?:Ill|Mass|Wash|Del|La|Miss|Ore|Pa)\.(?!\w)|(?i:no)\.(?=\s*\d)"
    r"|[A-Za-z]\.(?=[ \t])"  # initial: "B. "
    r"|'(?i:em|til|till|cause|n'|\d0s|s|m|d|ll|re|ve)(?!\w)|'t(?=(?i:is|was)\b)"  # 'em '90s, lone 's
    r"|(?:[-+]?\d+(?:[.,:]\d+)+|[-+]\d+|[-+]?\.\d+)(?:-[^\W_]+)*"  # 1,000 3.5 10:30 -5 .5 3.5-inch
    r"|[#@][^\W\d]\w*|[!?]{2,}|_+)"  # #tag @user; "!!!" and "?!" stay tokens
    r"|(?P<smiley>[:;]-?[()](?!\S))|(?P<fraction>\d+ \d+/\d+(?!\S))"  # Java: ":-rrb-", "5\xa07/8"
    r"|(?P<word>[A-Z]+(?:&[A-Z]+)+|[^\W_]+(?:(?:[-/_]|[.!?](?=[^\W\d_])|'(?=[^\W\d_]))[^\W_]+)*)"
    r"|(?P<drop>\.{2,}|-{2,})"
    r"|(?P<char>\S)")
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_CLITIC = re.compile(r"(?i)(?:n't|'(?:s|m|d|ll|re|ve))$")
_APOS_WORD = re.compile(r"[a-hj-xzA-HJ-XZ]'[^\W\d_]{2,}|[^\W\d_]+[aeiouyAEIOUY]'[aeiouA-Z][^\W\d_]*")  # o'clock ma'am


def _split_word(word: str) -> list[str]:
    low = word.lower()
    if low == "cannot":
        return [word[:3], word[3:]]
    if low in ("gonna", "gotta", "wanna", "lemme", "gimme"):
        return [word[:-2], word[-2:]]
    tail = []
    while (m := _CLITIC.search(word)) is not None and m.start() > 0:
        tail.insert(0, m.group())
        word = word[: m.start()]
    if "'" in word and not (_APOS_WORD.fullmatch(word) or _CLITIC.fullmatch(word)):  # a quote: split
        return [p for p in re.split(r"(^[yY]')|('n')|'", word) if p] + tail
    return [word, *tail]


def ptb_tokenize(text: str) -> str:
    """Tokenize one caption as the COCO caption evaluation does (PTB tokens, lower-cased, official
    PUNCTUATIONS removed), returned space-joined. See the module docstring for the exact rules."""
    text = text.replace("\n", " ").replace("&amp;", "&").translate(_CHAR_MAP)
    tokens: list[str] = []
    for m in _TOKEN.finditer(text):
        kind, token = m.lastgroup, m.group()
        if kind == "word":
            tokens.extend(_split_word(token))
        elif kind == "char" and token not in "\"'`":
            tokens.append(_BRACKETS.get(token, token))
        elif kind == "keep":
            tokens.append(token)
        elif kind == "smiley":
            tokens.append(token[:-1] + _BRACKETS[token[-1]])
        elif kind == "fraction":
            tokens.append(token.replace(" ", "\xa0"))
    return " ".join(t for t in (t.lower() for t in tokens) if t not in PUNCTUATIONS)


# --- caption scores ----------------------------------------------------------------------------------
def _few(ids) -> str:
    ids = sorted(ids, key=str)
    return ", ".join(map(repr, ids[:5])) + (f" (and {len(ids) - 5} more)" if len(ids) > 5 else "")


def caption_scores(predictions: Mapping, references: Mapping, paper: bool = False, meteor: Any = None) -> dict:
    """Corpus BLEU-1..4 and CIDEr-D of one predicted caption per image against its references; with
    `paper`, METEOR and ROUGE-L too (METEOR only where Java runs: else a warning line and no METEOR).
    `meteor`: a scorer from `start_meteor` (started early, its Java loads while the model decodes), False for
    none (its absence already said), None to start one here.

    ``predictions``: image_id -> caption; ``references``: image_id -> list of captions. Both are
    tokenized with :func:`ptb_tokenize` and scored with pycocoevalcap's Bleu(4) and Cider, exactly as
    COCOEvalCap does. The image id sets must be equal (ValueError naming the first few missing ids);
    an empty prediction scores 0 rather than failing."""
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
    except ImportError as e:
        raise ExtraMissing("scoring captions (BLEU-4, CIDEr-D)", "eval", e.name) from None

    no_pred, no_ref = set(references) - set(predictions), set(predictions) - set(references)
    if no_pred or no_ref:
        parts = [f"no prediction for image id(s) {_few(no_pred)}"] if no_pred else []
        parts += [f"no references for image id(s) {_few(no_ref)}"] if no_ref else []
        raise ValueError("caption_scores: " + "; ".join(parts))
    if not references:
        raise ValueError("caption_scores needs at least one image")
    gts, res = {}, {}
    for image_id, refs in references.items():
        if isinstance(refs, str) or not refs:
            raise ValueError(f"caption_scores: references for image id {image_id!r} must be a non-empty list")
        gts[image_id] = [ptb_tokenize(r) for r in refs]
        res[image_id] = [ptb_tokenize(predictions[image_id] or "")]
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    # Cider's idf needs at least one reference n-gram in the corpus; with none every score is 0.
    cider = Cider().compute_score(gts, res)[0] if any(r for refs in gts.values() for r in refs) else 0.0
    scores = {f"BLEU-{n + 1}": float(b) for n, b in enumerate(bleu)}
    if paper:
        from pycocoevalcap.rouge.rouge import Rouge

        scorer = start_meteor() if meteor is None else meteor
        value = meteor_score(scorer, gts, res) if scorer else None
        if value is not None:
            scores["METEOR"] = value
        scores["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    scores["CIDEr-D"] = float(cider)
    return scores


def java() -> str | None:
    """The `java` that pycocoevalcap's METEOR starts (it runs `java` from PATH), or None."""
    return shutil.which("java")


def start_meteor() -> Any:
    """pycocoevalcap's METEOR scorer, its Java process started (it loads its paraphrase tables while the caller
    goes on; the cost: docs/results/evaluation.md); None, and one warning line, when Java is missing or does not
    start."""
    log = get_logger("eval")
    if java() is None:
        log.warning("vqa eval: METEOR needs Java (no 'java' on PATH); the other caption scores are written")
        return None
    from pycocoevalcap.meteor.meteor import Meteor

    try:
        return Meteor()
    except OSError as e:
        log.warning("vqa eval: METEOR's Java process did not start (%s); the other caption scores are written", e)
        return None


def meteor_score(scorer: Any, gts: dict, res: dict) -> float | None:
    """The corpus METEOR of the tokenized captions from a `start_meteor` scorer, its process then stopped; None
    (and one warning line) when the process fails."""
    try:
        return float(scorer.compute_score(gts, res)[0])
    except (OSError, ValueError) as e:  # the jar answered nothing: it died (no memory for its -Xmx2G, say)
        scorer.meteor_p.kill()
        if scorer.lock.locked():
            scorer.lock.release()  # compute_score holds it when the answer is missing; __del__ takes it again
        get_logger("eval").warning("vqa eval: METEOR's Java process failed (%s); the other caption scores are "
                                   "written", e)
        return None
