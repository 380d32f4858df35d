"""The reasoning formats of model families: the one table of their markers.

A reasoning ("thinking") model writes a free-text span before its answer: ``<think>`` ...
``</think>`` (DeepSeek-R1, QwQ, Qwen3, SmolLM3, DeepSeek-V3.1), ``[THINK]`` ... ``[/THINK]``
(Mistral's reasoning models, Ministral-3 Reasoning), or gpt-oss's analysis channel
(``<|channel|>analysis<|message|>`` ... ``<|end|>``, then ``<|start|>assistant`` and the final
channel's header ``<|channel|>final<|message|>``). The names are vLLM's ``--reasoning-parser``
names (``deepseek_r1``, ``qwen3``, ``deepseek_v3``, ``mistral``, ``openai_gptoss``), with
``gpt_oss`` as an alias.

:func:`detect` reads the format from a chat template's text (fingerprints);
:meth:`ReasoningFormat.prompt_state` reads whether a rendered prompt already opened the span
(DeepSeek-R1's template ends with ``<think>\\n``), closed it (Qwen3's ``enable_thinking=False``
renders ``<think>\\n\\n</think>\\n\\n``), or left it to the model (Qwen3 by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PromptState(Enum):
    """Where a rendered generation prompt leaves the reasoning span."""

    OPEN = "open"  # the prompt opened it: the reply starts inside the span
    CLOSED = "closed"  # the prompt opened and closed it (thinking disabled): no span
    NONE = "none"  # the model opens it itself (or not)


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers of one family's reasoning span.

    Attributes
    ----------
    name:
        vLLM's ``--reasoning-parser`` name.
    start, end:
        The markers around the span.
    open_text:
        What the server writes to open the span when the prompt did not (``start`` and the
        whitespace the family writes after it).
    close_text:
        What is forced when the thinking budget is spent; it ends with ``end``.
    after_end:
        What the family writes between ``end`` and the answer (forced when the server enforces
        the span; the split takes it off the content).
    answer_header:
        Written before a text or JSON answer (gpt-oss's final channel); tool calls write their
        own header (the tool-call format's).
    special_markers:
        The markers are special tokens in the family's own tokenizer, which decoding would drop:
        replies of this format are decoded with the special tokens kept.
    fingerprints:
        Texts of a chat template that identify the format (all of one tuple must appear).
    aliases:
        Other names taken by ``--reasoning-parser``.
    """

    name: str
    start: str
    end: str
    open_text: str
    close_text: str
    after_end: str = ""
    answer_header: str = ""
    special_markers: bool = False
    fingerprints: tuple[tuple[str, ...], ...] = ()
    aliases: tuple[str, ...] = ()

    def prompt_state(self, prompt: str) -> PromptState:
        """Where the rendered generation prompt ``prompt`` leaves the span (only whitespace may
        follow the marker that decides it)."""
        opened, closed = prompt.rfind(self.start), prompt.rfind(self.end)
        if opened >= 0 and opened > closed and not prompt[opened + len(self.start):].strip():
            return PromptState.OPEN
        if closed >= 0 and closed > opened >= 0 and not prompt[closed + len(self.end):].strip():
            return PromptState.CLOSED
        return PromptState.NONE


def _think(name: str, fingerprint: tuple[str, ...], *aliases: str) -> ReasoningFormat:
    """A format of ``<think>`` tags (the span, then a blank line, then the answer)."""
    return ReasoningFormat(name, "<think>", "</think>", open_text="<think>\n",
                           close_text="\n</think>", after_end="\n\n",
                           fingerprints=(fingerprint,), aliases=aliases)


#: Every format, most specific fingerprint first (``detect`` takes the first that matches).
FORMATS: tuple[ReasoningFormat, ...] = (
    ReasoningFormat("openai_gptoss", "<|channel|>analysis<|message|>", "<|end|>",
                    open_text="<|channel|>analysis<|message|>", close_text="<|end|>",
                    after_end="<|start|>assistant", answer_header="<|channel|>final<|message|>",
                    special_markers=True, fingerprints=(("<|channel|>", "analysis"),),
                    aliases=("gpt_oss", "gpt-oss")),
    ReasoningFormat("mistral", "[THINK]", "[/THINK]", open_text="[THINK]", close_text="[/THINK]",
                    special_markers=True, fingerprints=(("[THINK]", "[/THINK]"),)),
    _think("deepseek_v3", ("<｜Assistant｜>", "<think></think>"), "deepseek-v3"),
    _think("deepseek_r1", ("<｜Assistant｜>", "<think>"), "deepseek-r1"),
    _think("qwen3", ("<think>", "</think>"), "qwen3-thinking"),
)

_BY_NAME = {n: f for f in FORMATS for n in (f.name, *f.aliases)}
#: What ``--reasoning-parser`` takes: the names, their aliases, and ``none`` (no span).
NAMES: tuple[str, ...] = (*sorted(_BY_NAME), "none")


def by_name(name: str) -> ReasoningFormat | None:
    """The format called ``name`` (None for ``none``); ``ValueError`` for an unknown name."""
    if name == "none":
        return None
    found = _BY_NAME.get(name)
    if found is None:
        raise ValueError(f"unknown reasoning parser {name!r}; one of: {', '.join(NAMES)}")
    return found


def detect(template: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template's text writes, or None (no reasoning span)."""
    if not template:
        return None
    for fmt in FORMATS:
        if any(all(part in template for part in parts) for parts in fmt.fingerprints):
            return fmt
    return None


def resolve(parser: str | None, template: str | None) -> ReasoningFormat | None:
    """``--reasoning-parser`` (a name, or None: detect from ``template``)."""
    return detect(template) if parser is None else by_name(parser)
