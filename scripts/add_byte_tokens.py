"""Give shipped towers byte fallback: their tokenizer gains the 256 byte tokens `<0x00>`..`<0xFF>` after its
vocabulary (every id keeps its meaning), their token embedding (the LM head is tied to it) 256 rows, each the
mean of the trained rows, and their card the new sha256 and a note of how the file was made.

    python scripts/add_byte_tokens.py [--name tiny]

Why the mean: with the head tied, a mean row's logit is the mean of the old logits, below the largest, so the
towers' greedy answers and captions are the ones they gave before, and the byte tokens start unlikely; with no
random offset the file is the same on every run. It runs once: towers whose tokenizer has the bytes are left.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vqa.identity import checkpoint_identity
from vqa.tokenizer import Tokenizer, with_byte_fallback
from vqa.weights import checkpoint, model_files, shipped
from vqa.weights.grow_vocab import grow_embedding


def add_byte_tokens(src: Path, dst: Path) -> dict:
    """The towers in checkpoint folder `src` with byte fallback, written to `dst` (model, config, tokenizer);
    returns what the card notes about it."""
    model, tok, _ = checkpoint.load(src)
    before, digest = tok.vocab_size, shipped.sha256(src / "model.safetensors")
    tok = Tokenizer(with_byte_fallback(tok.hf))
    model = grow_embedding(model, tok.vocab_size, offset=False)
    dst.mkdir(parents=True, exist_ok=True)
    model_files.save(model, dst)
    tok.save(dst / "tokenizer.json")
    return dict(made_by="python scripts/add_byte_tokens.py", from_sha256=digest,
                tokens_before=before, rows="256 byte tokens appended, each row the mean of the trained rows")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="tiny", help="the shipped towers (default tiny)")
    args = p.parse_args()
    folder = shipped.folder(args.name)
    card = shipped.card(args.name)
    if "byte_tokens" in card:
        print(f"{folder}: already has byte tokens ({card['byte_tokens']['made_by']}); nothing to do")
        return
    if card["sha256"] != shipped.sha256(folder / "model.safetensors"):
        raise SystemExit(f"{folder}/model.safetensors is not the file its card names (sha256 {card['sha256'][:12]})")
    card["byte_tokens"] = add_byte_tokens(folder, folder)
    model, _, _ = checkpoint.load(folder)
    card.update(parameters=sum(p.numel() for p in model.parameters()),
                sha256=shipped.sha256(folder / "model.safetensors"), identity=checkpoint_identity(folder))
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    print(f"{folder}: {card['byte_tokens']['tokens_before']} + 256 tokens, sha256 {card['sha256'][:12]}")


if __name__ == "__main__":
    main()
