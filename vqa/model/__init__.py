from . import config_file
from .attention import Attention
from .decoder import TextDecoder, sinusoidal_positions
from .encoder_decoder import Output, VQAModel
from .pretrained_lm import model_preset
from .vision import VisionEncoder

__all__ = ["Attention", "TextDecoder", "sinusoidal_positions", "Output", "VQAModel", "VisionEncoder", "model_preset",
           "config_file"]
