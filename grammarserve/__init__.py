"""grammarserve: structured-output and grammar-constrained LLM generation."""

from grammarserve.config import EngineConfig
from grammarserve.constraints import Constraint
from grammarserve.engine.request import RequestOutput
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

__all__ = ["LLM", "Constraint", "EngineConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
