"""No character is lost: the project's tokenizers spell a character their vocabulary lacks in its UTF-8 bytes
(byte fallback), so decode(encode(t)) == normalize(t) for any Unicode text t, checked over many random strings
drawn from scripts, combining marks, emoji, typography and whitespace; `<unk>` is never produced."""

from __future__ import annotations

import random

import pytest

from vqa.tokenizer import BYTE_TOKENS, Tokenizer, with_byte_fallback

# code point ranges the strings are drawn from (no surrogates: they are not text, and UTF-8 cannot hold them)
RANGES = [
    (0x20, 0x7E),  # printable ASCII
    (0xA0, 0x24F),  # Latin-1 supplement, Latin extended (é, ï, ß, ø, ł)
    (0x300, 0x36F),  # combining marks (e + U+0301)
    (0x370, 0x4FF),  # Greek, Cyrillic
    (0x590, 0x6FF),  # Hebrew, Arabic
    (0x900, 0x97F),  # Devanagari
    (0x1E00, 0x1EFF),  # Latin extended additional (Vietnamese)
    (0x2000, 0x206F),  # general punctuation: curly quotes, dashes, thin and zero-width spaces
    (0x2100, 0x2BFF),  # letterlike symbols, arrows, maths, the block elements (U+2581 is one)
    (0x3000, 0x30FF),  # CJK punctuation (ideographic space), hiragana, katakana
    (0x4E00, 0x9FFF),  # CJK ideographs
    (0xAC00, 0xD7A3),  # Hangul syllables
    (0xFB00, 0xFFFD),  # ligatures, presentation forms, full-width forms, specials
    (0x1F300, 0x1FAFF),  # emoji
    (0x10000, 0x10FFFF),  # the rest of the astral planes, unassigned included
]
WHITESPACE = " \t\n\r\u00a0\u2009\u3000\u200b\u2028"
WORDS = ["café", "naïve", "it’s", "“quoted”", "<eos>", "<unk>", "<0x41>", "▁", "e\u0301", "ﬁ", "Ⅻ", "👩‍👩‍👧"]


def random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            if kind < 0.15:
                parts.append(rng.choice(WHITESPACE))
            elif kind < 0.25:
                parts.append(rng.choice(WORDS))
            else:
                lo, hi = rng.choice(RANGES)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
        out.append("".join(parts))
    return out


def trained() -> Tokenizer:
    return Tokenizer.train(["What color is the big red circle?", "two blue squares, left of 3 stars."] * 3,
                           vocab_size=80)


def shipped_tokenizer() -> Tokenizer:
    from vqa.weights import shipped

    return Tokenizer.load(shipped.folder("tiny"))


@pytest.mark.parametrize("make", [trained, shipped_tokenizer], ids=["trained", "shipped"])
def test_decode_gives_back_every_character_of_any_text(make):
    tok = make()
    for text in random_texts(0, 2000):
        ids = tok.encode(text)
        assert tok.unk_id not in ids, text
        assert tok.decode(ids) == tok.normalize(text), text


@pytest.mark.parametrize("make", [trained, shipped_tokenizer], ids=["trained", "shipped"])
def test_the_words_ascii_lacks_are_spelled_in_bytes(make):
    tok = make()
    for word in ("café", "naïve", "it’s", "日本語", "😀"):
        ids = tok.encode(word)
        assert tok.unk_id not in ids and tok.decode(ids) == word
    assert [tok.id_to_token(i) for i in tok.encode("é")][-2:] == ["<0xC3>", "<0xA9>"]
    assert tok.normalize(" Café\u00a0ＡＢ ") == "café ab"  # what the normalizer changes, and only that


def test_byte_tokens_come_after_the_vocabulary_and_keep_every_id():
    tok = trained()
    hf = tok.hf
    n = hf.get_vocab_size() - len(BYTE_TOKENS)
    assert [hf.token_to_id(t) for t in BYTE_TOKENS] == list(range(n, n + 256))
    again = with_byte_fallback(hf)  # adding them twice adds nothing
    assert again.to_str() == hf.to_str()
    # text typed as a byte token's name is text, never that byte
    assert tok.decode(tok.encode("<0x41>")) == "<0x41>" and hf.token_to_id("<0x41>") not in tok.encode("<0x41>")
