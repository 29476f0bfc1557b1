"""Tokenizer: Hugging Face `tokenizers` BPE, trained on the training text, loaded from a `tokenizer.json`, or a
pretrained language model's own (`for_language_model`, with the special tokens below added).

It owns the special tokens and the two prompt formats (one model, two tasks):

    caption:  <bos> <caption>                     -> caption tokens ... <eos>
    vqa:      <bos> <question> q1 ... qn <answer> -> answer tokens ... <eos>

Text is NFKC-normalized and lower-cased; words are split on whitespace (kept as the `▁` marker, so decoding
restores the spaces) and punctuation, then BPE-merged. No character is lost: one the vocabulary lacks is spelled
in its UTF-8 bytes, the 256 tokens `<0x00>`..`<0xFF>` after the vocabulary (byte fallback, as Llama's tokenizer
does), so `decode(encode(t)) == normalize(t)` for any text (`normalize`: what NFKC and lower-casing leave). Text is
always encoded as text: "<eos>" or "<answer>" typed in a question or written in a caption are characters, never control
tokens (`encode_special_tokens`), so a user cannot rewrite the prompt and a caption cannot train an early stop. Special
tokens enter a sequence only by id, from the prompt builders below. A language model's tokenizer keeps its own rules
(GPT-2's: byte-level BPE, case kept, a word's leading space inside its first token as `Ġ`).

A captioner imported from Hugging Face (`vqa import`) keeps GPT-2's tokenizer as it is: `<|endoftext|>` is
its pad, start and end token, and a caption's prompt is that start token alone (`<bos>` without `<caption>`),
as it was trained; it has no VQA prompt until `with_prompt_tokens` adds <question> and <answer>.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from .errors import ConfigError, InputError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
CAPTION, QUESTION, ANSWER = "<caption>", "<question>", "<answer>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, CAPTION, QUESTION, ANSWER]  # ids 0..6, in this order
# GPT-2's one special token: in a tokenizer without vqa's <pad> <bos> <eos> <unk> (a captioner imported with
# `vqa import`) it is all four, and a caption's prompt is that start token alone (no <caption>); <question>
# and <answer> are added when such a model is fine-tuned for VQA (`with_prompt_tokens`)
LM_END = "<|endoftext|>"
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # byte fallback's tokens, named as Llama's and `tokenizers`' are


class Tokenizer:
    """Wraps a `tokenizers.Tokenizer` with the project's special tokens and prompt builders."""

    def __init__(self, hf: HFTokenizer):
        self.hf = hf
        hf.encode_special_tokens = True  # user text is text: "<eos>" in it is never the <eos> token
        hf.no_truncation()  # a pretrained tokenizer.json may carry its own limits: lengths are decided here
        hf.no_padding()
        ids = {t: hf.token_to_id(t) for t in SPECIAL_TOKENS}
        end = hf.token_to_id(LM_END)
        if all(ids[t] is None for t in (PAD, BOS, EOS, UNK)) and end is not None:  # a captioner's (see LM_END)
            ids.update({PAD: end, BOS: end, EOS: end, UNK: end})
        else:
            missing = [t for t, i in ids.items() if i is None]
            if missing:
                raise ConfigError(f"tokenizer lacks the special token(s) {', '.join(missing)}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids[PAD], ids[BOS], ids[EOS], ids[UNK]
        self.caption_id, self.question_id, self.answer_id = ids[CAPTION], ids[QUESTION], ids[ANSWER]
        self.special_ids = frozenset(i for i in ids.values() if i is not None)
        # what generation may never produce (`generate(banned=...)`): every special token but <eos> -- <pad>,
        # <bos>, <unk>, the task markers, and a language model's own special tokens (GPT-2's <|endoftext|>,
        # unless it is this tokenizer's <eos>). `decode` drops them all, so a model that emitted one would
        # say nothing where it seemed to say something.
        added = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}
        self.never_generated = frozenset((self.special_ids | added) - {self.eos_id})

    # ---- building, saving, loading ----
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 1,
              alphabet: Iterable[str] = ()) -> Tokenizer:
        """BPE of at most `vocab_size` tokens trained on `texts`, then the 256 byte tokens (`with_byte_fallback`);
        every character of `alphabet` is a token too, so that a word the texts never used is spelled in
        sub-words of it, and a character neither has in its UTF-8 bytes, never <unk>."""
        hf = HFTokenizer(models.BPE(unk_token=UNK))
        hf.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()]
        )
        hf.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False,
            initial_alphabet=sorted(set(alphabet)),
        )
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(with_byte_fallback(hf))

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"no tokenizer file at {path}")
        return cls(read_tokenizer_json(path))

    @classmethod
    def for_language_model(cls, folder: str | Path) -> Tokenizer:
        """A pretrained language model's own tokenizer (`folder/tokenizer.json`) with the special tokens added
        after its vocabulary (any it already has keep their ids); the model's embedding grows to match
        (`vqa.weights.language_model`)."""
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(
                f"{path}: missing. A pretrained decoder uses its language model's own tokenizer, as written by "
                "`tokenizers` (tokenizer.json); a folder with only vocab.json + merges.txt can be converted with "
                "transformers: AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")
        hf = read_tokenizer_json(path)
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        return cls(hf)

    def with_prompt_tokens(self) -> Tokenizer:
        """This tokenizer with <question> and <answer> added as special tokens after its vocabulary (a
        captioner's, which has neither): the VQA prompt then exists. The model's embedding grows to match
        (`vqa.weights.grow_vocab.grow_embedding`)."""
        hf = HFTokenizer.from_str(self.hf.to_str())
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (QUESTION, ANSWER)])
        return Tokenizer(hf)

    def split_words(self, texts: Iterable[str]) -> Counter:
        """How often each word of `texts` occurs that this tokenizer spells in two or more tokens, a word as its
        BPE sees it, after the normalizer and pre-tokenizer ("▁guitar"), of letters and digits only."""
        norm, pre = self.hf.normalizer, self.hf.pre_tokenizer
        seen: Counter = Counter()
        for text in texts:
            text = norm.normalize_str(text) if norm is not None else text
            seen.update([w for w, _ in pre.pre_tokenize_str(text)] if pre is not None else [text])
        dec, vocab = self.hf.decoder, self.hf.get_vocab()
        return Counter({w: n for w, n in seen.items() if w not in vocab and len(self.word_pieces(w)) > 1
                        and (dec.decode([w]) if dec is not None else w).strip().isalnum()})

    def word_pieces(self, word: str) -> list[int]:
        """The ids BPE spells one pre-tokenized `word` in ("▁guitar", as `split_words` names it)."""
        return [t.id for t in self.hf.model.tokenize(word)]

    def with_words(self, words: Iterable[str]) -> Tokenizer:
        """This tokenizer with each of `words` (as `split_words` names them) a token of its own, ids after its
        vocabulary. BPE then encodes a word its vocabulary holds whole (`ignore_merges`): such a word becomes
        its token wherever the pre-tokenizer isolates it ("guitar" in "a guitar?", not in "guitars"), and other
        words keep their tokens, as BPE's merges already spell each word the vocabulary holds whole (the
        byte and special tokens aside, which no text's word is: tests/test_new_words.py)."""
        spec = json.loads(self.hf.to_str())
        model = spec["model"]
        if model.get("type") != "BPE":
            raise ConfigError(f"new words need a BPE tokenizer, not {model.get('type')}")
        vocab = model["vocab"]
        for added in spec.get("added_tokens") or []:  # reading the file back numbers added tokens the BPE
            vocab.setdefault(added["content"], added["id"])  # lacks after its vocabulary: it holds them all
        n = len(vocab)
        if set(vocab.values()) != set(range(n)):
            raise ConfigError("new words need a tokenizer whose token ids run 0, 1, 2, ... without a gap")
        for word in words:
            if word in vocab:
                raise ConfigError(f"{word!r} is already a token")
            vocab[word], n = n, n + 1
        model["ignore_merges"] = True
        return Tokenizer(HFTokenizer.from_str(json.dumps(spec)))

    def save(self, path: str | Path) -> None:
        self.hf.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    # ---- text <-> ids ----
    def normalize(self, text: str) -> str:
        """`text` as `decode(encode(text))` gives it back: the tokenizer's normalizer applied (this project's
        BPE: NFKC, lower case), the word marker `▁` (U+2581) read as the space it stands for, and the outer
        whitespace dropped, as `decode` drops it. Nothing else changes: no character becomes <unk>."""
        norm = self.hf.normalizer
        text = norm.normalize_str(text) if norm is not None else text
        pre = self.hf.pre_tokenizer
        if pre is not None and b'"Metaspace"' in pre.__getstate__():
            text = text.replace("\u2581", " ")
        return text.strip()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, stopping at the first <eos> and dropping special tokens."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in self.special_ids:
                out.append(i)
        return self.hf.decode(out).strip()

    def id_to_token(self, i: int) -> str:
        return self.hf.id_to_token(int(i))

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Each token's text as the decoder writes it inside a sentence, a word's start with its leading space:
        "▁red" (this project's BPE) and "Ġred" (GPT-2's byte level) both give " red". Decoding each token
        after a one-letter stand-in keeps the space that decoders drop at the start of a text. (One byte of
        a multi-byte character shows as "\ufffd".)"""
        dec = self.hf.decoder
        out = []
        for i in ids:
            token = self.hf.id_to_token(int(i)) or ""
            out.append(dec.decode(["x", token])[1:] if dec is not None else token)
        return out

    def model_ids(self) -> dict:
        """The ModelConfig fields a model built for this tokenizer must have."""
        return dict(vocab_size=self.vocab_size, pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id)

    # ---- prompts ----
    def caption_prompt(self) -> list[int]:
        """`<bos> <caption>`; a captioner's tokenizer (no <caption>): its start token alone, as it was trained."""
        return [self.bos_id] if self.caption_id is None else [self.bos_id, self.caption_id]

    @staticmethod
    def max_question_tokens(max_len: int) -> int:
        """The longest question (in tokens) a context of `max_len` takes: three prompt specials, and room
        for at least one answer token and <eos>."""
        room = max_len - 3 - 2
        if room < 1:
            raise ConfigError(f"max_len={max_len} leaves no room for a question")
        return room

    def vqa_prompt(self, question: str, max_len: int | None = None) -> list[int]:
        """`<bos> <question> q... <answer>`; with `max_len`, a question too long to fit is cut from the end
        (documented truncation) to `max_question_tokens(max_len)` tokens, leaving room to answer."""
        if not isinstance(question, str) or not question.strip():
            raise InputError("the question is empty")
        if self.question_id is None or self.answer_id is None:
            raise InputError("this model is a captioner (imported, its tokenizer has no <question> / <answer>): "
                             "fine-tune it for questions first with `vqa train --init-from RUN --data DIR`")
        q = self.encode(question)
        if max_len is not None:
            q = q[: self.max_question_tokens(max_len)]
        return [self.bos_id, self.question_id, *q, self.answer_id]

    def target(self, text: str) -> list[int]:
        """Target tokens: the text then <eos>."""
        return [*self.encode(text), self.eos_id]


def with_byte_fallback(hf: HFTokenizer) -> HFTokenizer:
    """`hf` (a BPE) with byte fallback: the byte tokens it lacks appended after its vocabulary, so every id
    keeps its meaning (an embedding grows to match: `vqa.weights.grow_vocab`), a
    character outside the vocabulary encoded as its UTF-8 bytes, and decoding joining the bytes back."""
    spec = json.loads(hf.to_str())
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ConfigError(f"byte fallback needs a BPE tokenizer, not {model.get('type')}")
    vocab = model["vocab"]
    n = hf.get_vocab_size()  # added tokens count too: new ids come after every id in use
    for token in BYTE_TOKENS:
        if token not in vocab:
            vocab[token], n = n, n + 1
    model["byte_fallback"] = True
    old = spec.get("decoder")
    if not _has_byte_fallback(old):
        spec["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, *([old] if old else [])]}
    return HFTokenizer.from_str(json.dumps(spec))


def _has_byte_fallback(decoder: dict | None) -> bool:
    if not decoder:
        return False
    return decoder.get("type") == "ByteFallback" or any(_has_byte_fallback(d) for d in decoder.get("decoders", []))


def read_tokenizer_json(path: Path) -> HFTokenizer:
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with the serde message
        raise ConfigError(f"{path}: not a valid tokenizer.json ({e})") from e
