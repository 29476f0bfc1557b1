"""`vqa train --new-words N`: a run that starts from pretrained weights and their tokenizer (the tiny preset's
towers, --init-from, a pretrained language model) makes the training split's N most frequent words that the
tokenizer spells in two or more tokens tokens of their own, so a new vocabulary costs an answer no more tokens
than a tokenizer trained on the data would. The embedding, and the LM head tied to it, gains a row for each:
the mean of the rows of the pieces that spelled the word. Every other weight and token stays as it was."""

from __future__ import annotations

import torch

from ..config import TrainConfig, preset_fields
from ..data.sources import training_texts
from ..distributed import Dist
from ..errors import ConfigError
from ..logs import get_logger
from ..model import VQAModel
from ..tokenizer import Tokenizer
from ..weights.grow_vocab import grow_embedding

log = get_logger("train")


def check_new_words(cfg: TrainConfig, shipped: str | None) -> None:
    """At start-up: --new-words only where the tokenizer is a pretrained one (`shipped`: the preset's shipped
    towers, if the run starts from them); a tokenizer trained on the data has its words already."""
    if not cfg.new_words:
        return
    flag = f"--new-words {cfg.new_words}"
    if cfg.from_scratch:
        raise ConfigError(f"{flag} cannot apply with --from-scratch: the tokenizer is then trained on the data's own "
                          "words; leave one of them out")
    lm = preset_fields(cfg.preset, cfg.model).get("dec_pretrained")
    if not (cfg.init_from or shipped or lm):
        given = f"--tokenizer {cfg.tokenizer} gives" if cfg.tokenizer else "the run trains"
        raise ConfigError(f"{flag} applies to a run that starts from pretrained weights and their tokenizer (the "
                          f"tiny preset's towers, --init-from, a pretrained decoder); here {given} the tokenizer "
                          "and the weights start random; leave --new-words out")


def frequent_words(tok: Tokenizer, train_data, n: int, dist: Dist) -> list[str]:
    """The `n` words of the training split's text (questions, answers, captions) that `tok` spells in two or
    more tokens, the most frequent first (ties: in order of the words); counted on rank 0, sent to the others."""
    words = [None]
    if dist.main:
        counts = tok.split_words(text for batch in training_texts(train_data) for text in batch)
        words = [[w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]]
    if dist.world > 1:
        torch.distributed.broadcast_object_list(words, src=0)
    return words[0]


@torch.no_grad()
def with_new_words(model: VQAModel, tok: Tokenizer, words: list[str]) -> tuple[VQAModel, Tokenizer]:
    """`tok` with `words` as tokens (`Tokenizer.with_words`), and `model` grown to match, each new row the
    mean of the rows of the word's pieces. The LM head is the embedding, so a new token's logit is the mean of
    its pieces' logits, never above the largest: greedy decoding answers as before until training moves it."""
    if model.decoder.head_weight is not model.decoder.embed.weight:
        raise ConfigError("--new-words: this decoder's LM head is not tied to its embedding (dec_tie_head=false); "
                          "leave --new-words out")
    grown_tok = tok.with_words(words)
    grown = grow_embedding(model, grown_tok.vocab_size, offset=False)
    embed = grown.decoder.embed.weight
    for word in words:
        embed[grown_tok.hf.token_to_id(word)] = embed[tok.word_pieces(word)].float().mean(0).to(embed.dtype)
    return grown, grown_tok


def add_new_words(cfg: TrainConfig, model: VQAModel, tok: Tokenizer, train_data, dist: Dist,
                  card: dict) -> tuple[VQAModel, Tokenizer]:
    """A new run's model and tokenizer with --new-words applied (none: as they are); the card names the words."""
    if not cfg.new_words:
        return model, tok
    words = frequent_words(tok, train_data, cfg.new_words, dist)
    model, tok = with_new_words(model, tok, words)
    card["new_words"] = [tok.pieces([tok.hf.token_to_id(w)])[0].strip() for w in words]
    if dist.main:
        shown = ", ".join(card["new_words"][:10]) + (", ..." if len(words) > 10 else "")
        log.info(f"vqa train: --new-words: {len(words)} of the training text's words became tokens ({shown}); "
                 f"embedding and LM head grown to {tok.vocab_size} rows")
    return model, tok
