"""A run folder's own files and the TrainConfig they resolve to: `train_config.json` (the saved options),
`max_steps_command.txt` (a time-limited run's step count and the command that repeats it by steps).

The options of a `vqa train` call resolve in layers:

    TrainConfig defaults < the preset's training defaults < --config FILE < the saved run (--resume) < flags

Only options the user typed count as flags (see `vqa.options`). On `--resume` the run's saved
`train_config.json` is the base, so `vqa train --out RUN --resume` needs nothing else, and what is typed now
wins (`--max-steps 8` extends a finished run, `--lr` changes the rate from here on); what fixes the model
(preset, --set, tokenizer, optimizer, --init-from) cannot change. With `--init-from RUN` and no `--preset`,
the preset (and so the training defaults) is the source run's.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import LENGTH_FIELDS, TrainConfig, check_fields, get_preset, train_defaults
from ..errors import ConfigError
from ..logs import get_logger
from ..options import read_config_file

SAVED = "train_config.json"
REPEAT = "max_steps_command.txt"  # a time-limited run's step count and the command that repeats it by steps
FIXED_ON_RESUME = ("preset", "model", "tokenizer", "vocab_size", "init_from", "optimizer", "train_only",
                   "new_words")

log = get_logger("train")


def _layer(base: dict, top: dict) -> dict:
    """`top` over `base`; a mapping (`model`) merges; one length option (epochs / steps / time) replaces another."""
    out = dict(base)
    if any(k in top for k in LENGTH_FIELDS):
        for k in LENGTH_FIELDS:
            out.pop(k, None)
    for k, v in top.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _source_preset(init_from: str) -> str | None:
    from ..weights.checkpoint import resolve

    try:
        card = json.loads((resolve(init_from) / "card.json").read_text())
    except (OSError, ValueError):
        return None
    return card.get("preset") if isinstance(card, dict) else None


def resolve(flags: dict, config_file: str | None = None, quiet: bool = False) -> TrainConfig:
    """The TrainConfig of a `vqa train` call: `flags` (the options typed) over the layers above."""
    file = read_config_file(config_file) if config_file else {}
    check_fields(TrainConfig, file, f"--config {config_file}:")
    top = _layer(file, flags)
    out = top.get("out")
    if not out:
        raise ConfigError("--out is required (the run folder)")
    saved_path = Path(out) / SAVED
    if top.get("resume") and saved_path.is_file():
        try:
            saved = json.loads(saved_path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{saved_path}: not valid JSON ({e.msg}); remove it to resume from the flags") from None
        old = TrainConfig.from_dict(saved, what=f"{saved_path}:").to_dict()
        new = TrainConfig.from_dict(_layer(saved, top)).to_dict()
        for key in FIXED_ON_RESUME:
            if new[key] != old[key]:
                raise ConfigError(f"{out} was trained with {key}={old[key]!r}; it cannot change on --resume "
                                  f"(got {new[key]!r}); start a new run with --init-from {out} instead")
        changed = [k for k in new if k != "resume" and new[k] != old[k]]
        if changed and not quiet:
            log.info("vqa train: resuming with " + ", ".join(f"{k}={new[k]!r} (was {old[k]!r})" for k in changed))
        return TrainConfig.from_dict(new)
    if top.get("init_from") and "preset" not in top:
        src = _source_preset(top["init_from"])
        if src:
            top["preset"] = src
    if not top.get("data"):
        raise ConfigError("--data is required (a data folder; `vqa data shapes --out data/shapes` builds one to try)")
    name = top.get("preset", TrainConfig.preset)
    get_preset(name)  # an unknown name: the error lists the presets
    cfg = TrainConfig.from_dict(_layer(train_defaults(name), top))
    return cfg.with_preset_defaults()


def _flag(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def command_line(cfg: TrainConfig, **changes) -> str:
    """The `vqa train` command that trains `cfg` (with `changes`) from scratch: --data, --out and --preset,
    then every option whose value differs from what the preset gives by default. A time-limited run's
    `command_line(cfg, time_limit=None, max_steps=N, ...)` repeats it by steps, on any machine."""
    import dataclasses
    import shlex

    cfg = dataclasses.replace(cfg, **changes)
    base = TrainConfig.from_dict({**train_defaults(cfg.preset), "preset": cfg.preset}).with_preset_defaults()
    words = ["vqa", "train", "--data", cfg.data, "--out", cfg.out, "--preset", cfg.preset]
    for f in dataclasses.fields(TrainConfig):
        value, default = getattr(cfg, f.name), getattr(base, f.name)
        if f.name in ("data", "out", "preset", "resume") or value == default or value is None:
            continue
        if isinstance(value, bool):
            words.append(_flag(f) if value else "--no-" + _flag(f)[2:])
        elif isinstance(value, dict):
            for k, v in value.items():
                if default.get(k) != v:
                    words += [_flag(f), f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
        elif isinstance(value, tuple):
            words += [_flag(f), ",".join(map(str, value))]
        else:
            words += [_flag(f), str(value)]
    return shlex.join(words)


def write_repeat_command(cfg: TrainConfig, out: Path, step: int, images_per_step: int) -> str:
    """How many steps a time limit allowed, and the `--max-steps` command that trains the same schedule on any
    machine: kept in the run folder (REPEAT, for `make demo` to print again) and returned."""
    cmd = command_line(cfg, time_limit=None, max_steps=step, resume=False, out=f"{out}-{step}")
    text = (f"--time-limit {cfg.time_limit} reached step {step} ({images_per_step} images a step) on this "
            f"machine; the same run by steps, on any machine:\n  {cmd}\n")
    (out / REPEAT).write_text(text)
    return text


__all__ = ["resolve", "command_line", "write_repeat_command", "SAVED", "REPEAT", "FIXED_ON_RESUME"]
