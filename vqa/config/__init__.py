"""The three configurations and the named presets.

- `ModelConfig`: the architecture, saved as `config.json` beside `model.safetensors` in every checkpoint.
  Fields are prefixed by the part they configure (`vit_*` image encoder, `dec_*` text decoder), as in nanoVLM.
- `TrainConfig`: everything `vqa train` takes (the command line is generated from it, see `vqa.options`);
  a run folder keeps the resolved one as `train_config.json`.
- `GenerationConfig`: how text is decoded (greedy, beam search, sampling), validated here and passed whole
  through `generate`, the `Predictor`, the CLI, evaluation and the app.

A preset is one entry of `PRESETS`: its model fields and its training defaults together.

Files: `base` (JSON I/O, field checks, removed options), `model`, `presets`, `train`, `generation`,
`decoding_methods` (the registry of decoding methods).
"""

from __future__ import annotations

from .base import REMOVED_FIELDS, check_fields
from .decoding_methods import DECODING_METHODS, DecodingMethod, ranking_methods
from .generation import ANSWER_TOKENS, CAPTION_TOKENS, GenerationConfig
from .model import DEC_ACTIVATIONS, ModelConfig, timm_data_config
from .presets import GPT2_DECODER, PRESETS, VIT_ARCHITECTURE, Preset, get_preset, preset, preset_fields
from .train import LENGTH_FIELDS, PARTS, TrainConfig, parse_duration, parse_tasks, train_defaults

__all__ = [
    "REMOVED_FIELDS", "check_fields", "ANSWER_TOKENS", "CAPTION_TOKENS", "DECODING_METHODS", "DecodingMethod",
    "ranking_methods", "GenerationConfig", "DEC_ACTIVATIONS", "ModelConfig", "timm_data_config",
    "GPT2_DECODER", "PRESETS", "VIT_ARCHITECTURE", "Preset", "get_preset", "preset", "preset_fields",
    "LENGTH_FIELDS", "PARTS", "TrainConfig", "parse_duration", "parse_tasks", "train_defaults",
]
