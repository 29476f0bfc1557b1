"""What makes a collection job's records what they are, beyond their inputs: the model (`vqa.identity`: the
whole content of its weights, adapters, config and tokenizer), its precision, the task and the decoding
settings. Each record carries their digest as `settings`, so a record's identity is its input key
(`loader.record_key`) with its settings; a rerun into an output whose records carry another digest is refused
before any decoding (resuming would otherwise skip every input and mix two models' records). Batch size,
loader workers, the device and compiling change no output beyond float rounding: not part of it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError


@dataclass(frozen=True)
class JobSettings:
    """The settings of one job; `digest` is what its records carry."""

    fields: dict  # {"task" (caption, ask, point), "weights", "precision", "answers" (top-k), GenerationConfig's}

    @classmethod
    def of(cls, pred, task: str, generation, top_k: int = 1) -> JobSettings:
        weights = pred.identity or "in-memory"
        return cls(dict(task=task, weights=weights, precision=pred.precision, answers=int(top_k),
                        **generation.to_dict()))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def describe(self) -> str:
        g = {k: v for k, v in self.fields.items() if k not in ("task", "weights", "precision", "answers")}
        shown = ", ".join(f"{k}={v}" for k, v in g.items() if v is not None)
        return f"{self.fields['task']}, weights {self.fields['weights']}, {self.fields['precision']}, {shown}"

    def check(self, out: Path | None, found: set) -> None:
        """ConfigError when the records already in `out` carry another digest than this job's."""
        other = sorted(str(d or "none") for d in found if d != self.digest)
        if out is None or not other:
            return
        raise ConfigError(f"--out {out}: its records were made with other settings (settings {other[0]}; this "
                          f"run's are {self.digest}: {self.describe()}); another model or other decoding options "
                          "need another --out")


__all__ = ["JobSettings"]
