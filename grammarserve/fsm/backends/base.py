"""The backend seam: a ``GrammarBackend`` turns a validated ``GrammarSpec`` into a
``CompiledGrammar`` whose matchers implement :class:`grammarserve.fsm.matcher.Matcher`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from grammarserve.fsm.config import GrammarConfig, GrammarSpec
from grammarserve.fsm.matcher import CompiledGrammar
from grammarserve.fsm.vocab import VocabInfo


class GrammarBackend(ABC):
    """One grammar engine (xgrammar, llguidance).

    Contract
    --------
    - ``compile(spec)`` is called from compile worker threads, possibly concurrently; it must be
      thread-safe. It raises a :class:`grammarserve.errors.GrammarError` subclass (usually
      ``GrammarBackendError`` or ``UnsupportedSchemaError``) when the backend refuses the spec,
      including for any keyword it would otherwise silently ignore. It never returns a grammar
      that is laxer than the spec, except for the documented ``format`` annotations.
    - The matchers it creates allow the vocabulary's stop tokens exactly where the grammar may
      end, and no other special token.
    """

    name: ClassVar[str]
    #: Version of the format :meth:`serialize` writes ("": the backend serializes nothing).
    serial_format: ClassVar[str] = ""

    def __init__(self, vocab: VocabInfo, config: GrammarConfig) -> None:
        self.vocab = vocab
        self.config = config

    @abstractmethod
    def compile(self, spec: GrammarSpec, *, background: bool = False) -> CompiledGrammar:
        """Compile ``spec``; raise a ``GrammarError`` subclass if refused. ``background`` says
        nobody waits for the result (a backend may then trade compile time for faster masks)."""

    def warmup(self, max_whitespace: int | None) -> None:
        """Build lazily built tables now (called at start-up)."""

    def accepts(self, spec: GrammarSpec) -> bool:
        """Cheap pre-check: False if :meth:`compile` would certainly refuse ``spec``."""
        return True

    def upgrade_pays(self, spec: GrammarSpec) -> bool:
        """Whether this backend's masks for ``spec`` are expected to be faster than the first
        backend's, so that ``auto`` upgrading to it pays (see ``policy.py``)."""
        return True

    def serialize(self, grammar: CompiledGrammar) -> str | None:
        """``grammar`` (one this backend compiled in the background) as text that
        :meth:`restore` reads back, or None if this backend cannot (the disk cache,
        ``disk_cache.py``)."""
        return None

    def restore(self, spec: GrammarSpec, text: str) -> CompiledGrammar:
        """The grammar :meth:`serialize` wrote for ``spec``, as ``compile(spec,
        background=True)`` returns it; raises ``ValueError`` if ``text`` is not one."""
        raise ValueError(f"the {self.name} backend restores no serialized grammar")
