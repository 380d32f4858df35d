"""Backend registry with lazy imports: a backend's library is imported only when it is built."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grammarserve.fsm.backends.base import GrammarBackend
    from grammarserve.fsm.config import GrammarConfig
    from grammarserve.fsm.vocab import VocabInfo

_REGISTRY: dict[str, tuple[str, str]] = {
    "xgrammar": ("grammarserve.fsm.backends.xgrammar_backend", "XGrammarBackend"),
    "llguidance": ("grammarserve.fsm.backends.llguidance_backend", "LLGuidanceBackend"),
}


def backend_names() -> list[str]:
    """Names of the registered backends."""
    return list(_REGISTRY)


def create_backend(name: str, vocab: VocabInfo, config: GrammarConfig) -> GrammarBackend:
    """Import and build backend ``name``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown grammar backend {name!r}; choose one of {backend_names()}")
    module, cls = _REGISTRY[name]
    backend_cls = getattr(importlib.import_module(module), cls)
    return backend_cls(vocab, config)  # type: ignore[no-any-return]
