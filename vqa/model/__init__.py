from .attention import Attention, KVCache
from .decoder import TextDecoder, sinusoidal_positions
from .encoder_decoder import Output, VQAModel
from . import config_file
from .pretrained_lm import model_preset
from .vision import VisionEncoder

__all__ = ["Attention", "KVCache", "TextDecoder", "sinusoidal_positions", "Output", "VQAModel", "VisionEncoder", "model_preset"]
