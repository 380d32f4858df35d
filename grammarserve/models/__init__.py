"""Llama-family decoders and their loaders."""

from grammarserve.models.config import ModelConfig
from grammarserve.models.llama import LlamaModel
from grammarserve.models.loader import LoadedModel, load_model

__all__ = ["LlamaModel", "LoadedModel", "ModelConfig", "load_model"]
