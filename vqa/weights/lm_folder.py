"""A language model's folder in the Hugging Face layout: finding it (a local folder, or the Hub's cache) and
reading its safetensors weights by name, for the pretrained decoders (`vqa.weights.gpt2` for GPT-2,
`vqa.weights.llama` for Llama-layout models)."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from pathlib import Path

import torch

from ..errors import ConfigError
from ..tokenizer import Tokenizer, read_tokenizer_json

HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
             "tokenizer.json"]
NEW_ROW_OFFSET = 0.1  # added token rows: mean + this x (per-dimension std) x N(0, 1)
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def resolve(source: str) -> Path:
    """The folder of `source`: a local folder, or a Hub name fetched by huggingface_hub (cached there)."""
    source = str(source)
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ConfigError(f"dec_pretrained={source!r} is a file: give the folder that holds config.json, "
                          "model.safetensors and tokenizer.json")
    if source.startswith((".", "/", "~")) or not _HUB_NAME.fullmatch(source):
        raise ConfigError(f"dec_pretrained={source!r}: no such folder")
    return _hub_snapshot(source)


@functools.lru_cache(maxsize=8)
def _hub_snapshot(name: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown name, gated: all end the same way for the user
        reason = (str(e).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"dec_pretrained={name!r}: no such folder here, and fetching it from the Hugging Face Hub failed "
            f"({type(e).__name__}: {reason}). Offline: on a machine with internet run `hf download {name} "
            f"config.json model.safetensors tokenizer.json --local-dir DIR`, copy DIR here and pass "
            f"--set dec_pretrained=DIR") from None


class Weights:
    """The tensors of model.safetensors (or of the shards an index names), by GPT-2 name without the
    `transformer.` prefix that GPT2LMHeadModel.save_pretrained writes."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack):
        from safetensors import safe_open

        single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
        if single.is_file():
            files = {None: single}
        elif index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{index}: not a safetensors index ({e})") from None
            files = {name: folder / shard for name, shard in weight_map.items()}
        else:
            pickled = [n for n in ("pytorch_model.bin", "model.bin") if (folder / n).is_file()]
            hint = (f" (there is {pickled[0]}: a pickle, which vqa does not load; convert it to safetensors)"
                    if pickled else "")
            raise ConfigError(f"{single}: missing{hint}")
        self.label = single.name if None in files else index.name
        handles = {}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise ConfigError(f"{path}: missing (named by {index.name})")
            try:
                handles[path] = stack.enter_context(safe_open(str(path), framework="pt"))
            except Exception as e:  # safetensors raises its own error type for a bad header
                raise ConfigError(f"{path}: not a safetensors file ({e})") from None
        self.where: dict[str, tuple] = {}
        for path, h in handles.items():
            for key in h.keys():
                self.where[key.removeprefix("transformer.")] = (h, key, path)
        self.folder = folder

    def keys(self) -> set[str]:
        return set(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        h, key, _ = self.where[name]
        return tuple(h.get_slice(key).get_shape())

    def get(self, name: str) -> torch.Tensor:
        h, key, _ = self.where[name]
        return h.get_tensor(key)


def new_rows(wte: torch.Tensor, n: int) -> torch.Tensor:
    """`n` embedding rows for added tokens: the mean of `wte`'s rows plus NEW_ROW_OFFSET x (per-dimension std)
    x N(0, 1), so their logits start ordinary and each differs from the others."""
    wte = wte.float()
    return wte.mean(0) + torch.randn(n, wte.shape[1]) * wte.std(0) * NEW_ROW_OFFSET


def check_built_for(cfg, arch: dict, path: Path) -> None:
    """The decoder config `cfg` must hold the language model's architecture `arch` (`model_preset` does that)."""
    wrong = [f"{k}={getattr(cfg, k)!r} (config.json gives {v!r})" for k, v in arch.items() if getattr(cfg, k) != v]
    if wrong:
        raise ConfigError(f"the decoder was not built for {path}: " + ", ".join(wrong) +
                          "; build its config with vqa.weights.language_model.model_preset(..., dec_pretrained=...)")


def text_vocab(folder: Path) -> int:
    """The size of the language model's own tokenizer, before vqa's special tokens."""
    if not (folder / "tokenizer.json").is_file():
        Tokenizer.for_language_model(folder)  # the missing-tokenizer error
    return read_tokenizer_json(folder / "tokenizer.json").get_vocab_size()


def checked_weights(folder: Path, stack: contextlib.ExitStack, want: dict, ignored: re.Pattern,
                    about: tuple[str, str, str] = ("", "", "")) -> Weights:
    """The folder's Weights, which must hold exactly the tensors of `want` (name -> shape), beside the `ignored`
    ones and a tied model's stored head; `about`: what of config.json the missing / extra / shape lines cite."""
    w = Weights(folder, stack)
    where = folder / w.label
    missing = sorted(set(want) - w.keys(), key=_natural)
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}, which "
                          f"config.json{about[0]} describes: config and weights do not match")
    extra = sorted((k for k in w.keys() - set(want) if not ignored.fullmatch(k)), key=_natural)
    if extra and extra != ["lm_head.weight"]:  # a tied model may still store its head: the embedding's copy
        raise ConfigError(f"{where} holds tensors config.json does not describe{about[1]}: "
                          f"{', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}")
    for name, shape in want.items():
        if w.shape(name) != shape:
            raise ConfigError(f"{where}: {name} is {list(w.shape(name))}, but config.json{about[2]} implies "
                              f"{list(shape)}: config and weights do not match")
    return w


def copy_vocab(param: torch.Tensor, rows: torch.Tensor, n_text: int) -> None:
    """The language model's first `n_text` rows (past its tokenizer they are never produced) into `param`, and
    `new_rows` for vqa's special tokens after them."""
    rows = rows[:n_text].float()  # [n_text, D]
    param[:n_text].copy_(rows)
    if param.shape[0] > n_text:
        param[n_text:].copy_(new_rows(rows, param.shape[0] - n_text))


def free_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
