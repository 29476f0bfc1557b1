from .attention import Attention
from .decoder import TextDecoder, sinusoidal_positions
from .encoder_decoder import Output, VQAModel
from .vision import VisionEncoder

__all__ = ["Attention", "TextDecoder", "sinusoidal_positions", "Output", "VQAModel", "VisionEncoder"]
