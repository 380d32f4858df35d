"""grammarserve: structured-output and grammar-constrained LLM generation."""

from grammarserve.config import EngineConfig
from grammarserve.engine.request import RequestOutput
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
