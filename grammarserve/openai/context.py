"""What translating a request needs to know of the model and of the server's limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammarserve.config import EngineConfig
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.reasoning_formats import ReasoningFormat, resolve
from grammarserve.models.prompt_tokens import SegmentEncoder
from grammarserve.openai.limits import prompt_char_bound
from grammarserve.openai.logprobs import TokenTexts
from grammarserve.openai.tool_detect import resolve_tool_parser


@dataclass(frozen=True)
class ModelContext:
    """The model side of the protocol layer; build it with :meth:`create`.

    Parameters
    ----------
    tokenizer:
        The model's Hugging Face tokenizer (chat template, prompt encoding).
    compiler:
        Runs the front end of each constraint up front (a schema it refuses is a 400 before
        anything is queued) and hands the engine the result (``Constraint.prepared``); what
        the backends refuse comes back from the engine's compile as the same 400. The
        engine's own compiler in-process, the server's own (front end only) in the server.
        ``None`` skips the up-front check (the engine still refuses a bad constraint).
    max_model_len, max_n:
        The context limit and the largest ``n``.
    model_name:
        The ``model`` reported in replies.
    tool_call_format:
        The engine's format for ``required`` and named tool calls (``EngineConfig``).
    tool_call_parser:
        The model family's tool-call format for every mode (a name of the formats table),
        resolved by :meth:`create` from ``EngineConfig.tool_call_parser`` and the chat
        template; None: ``tool_call_format``, and Hermes for ``auto``.
    token_texts:
        Token texts for logprobs (built from ``tokenizer`` by :meth:`create`).
    max_prompt_chars:
        Characters of a prompt refused before tokenizing (``None``: no check); :meth:`create`
        derives it from the context (:func:`~grammarserve.openai.limits.prompt_char_bound`).
    max_choices:
        Engine requests (prompts x ``n``) one request may ask for (``None``: no limit).
    reasoning_format:
        The reasoning span of the model's replies (``EngineConfig.reasoning_parser``, else read
        from the chat template), or None.
    strict_thinking:
        The default of ``strict_thinking`` (``EngineConfig.strict_thinking``).
    prompt_encoder:
        Tokenizes rendered prompts with the pieces between added tokens cached (the tools block
        of an agent's every request; :meth:`create` builds it), or None: one encode call.
    vocab_size:
        The model's ``vocab_size`` (``Engine.vocab_size``, the engine's info ``vocab_size``):
        the one bound of token ids in requests (prompt ids, ``logit_bias`` keys; see
        :mod:`grammarserve.engine.validate`), or None: left to the engine to check.
    """

    tokenizer: Any
    compiler: GrammarCompiler | None
    max_model_len: int
    max_n: int
    model_name: str
    tool_call_format: str
    token_texts: TokenTexts
    max_prompt_chars: int | None = None
    max_choices: int | None = None
    reasoning_format: ReasoningFormat | None = None
    strict_thinking: bool = False
    tool_call_parser: str | None = None
    prompt_encoder: SegmentEncoder | None = None
    vocab_size: int | None = None

    @classmethod
    def create(cls, tokenizer: Any, compiler: GrammarCompiler | None, *, max_model_len: int,
               max_n: int, model_name: str,
               tool_call_format: str = EngineConfig.tool_call_format,
               max_prompt_chars: int | None = None,
               max_choices: int | None = None,
               reasoning_parser: str | None = EngineConfig.reasoning_parser,
               strict_thinking: bool = EngineConfig.strict_thinking,
               tool_call_parser: str = EngineConfig.tool_call_parser,
               vocab_size: int | None = None) -> ModelContext:
        """A context for ``tokenizer`` (its token texts built once; ``max_prompt_chars``
        derived from the context when not given)."""
        if max_prompt_chars is None and tokenizer is not None:
            max_prompt_chars = prompt_char_bound(tokenizer, max_model_len)
        template = getattr(tokenizer, "chat_template", None)
        template = template if isinstance(template, str) else None
        reasoning = resolve(reasoning_parser, template)
        family = resolve_tool_parser(tool_call_parser, template)
        return cls(tokenizer, compiler, max_model_len, max_n, model_name, tool_call_format,
                   TokenTexts(tokenizer), max_prompt_chars, max_choices,
                   reasoning_format=reasoning, strict_thinking=strict_thinking,
                   tool_call_parser=family,
                   prompt_encoder=SegmentEncoder(tokenizer) if tokenizer is not None else None,
                   vocab_size=vocab_size)

    def encode(self, text: str) -> list[int]:
        """The ids of a rendered prompt (``tokenizer.encode(text, add_special_tokens=False)``;
        long pieces between added tokens from ``prompt_encoder``'s cache when there is one)."""
        if self.prompt_encoder is not None:
            return self.prompt_encoder.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def model_name(config: EngineConfig, folder: str | None = None, served: str | None = None
               ) -> str:
    """The ``model`` replies report: ``served`` if given, else the model folder's name
    (``SmolLM2-135M-Instruct`` for ``default``)."""
    if served:
        return served
    if config.model == "default":
        return "SmolLM2-135M-Instruct"
    return Path(folder or config.model).name or config.model
