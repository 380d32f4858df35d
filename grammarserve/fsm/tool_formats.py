"""The tool-call formats: one table (:data:`FORMATS`) of how each model family writes its calls.

A reply's calls are ``list_open`` + call (+ ``sep`` + call)* + ``list_close``. A call is
``call_open`` + the tool's name + ``name_close`` + its arguments + ``call_close``, or, when
``name_key`` is set, ``call_open`` + one JSON object ``{"<name_key>": NAME, "<args_key>": ARGS}``
+ ``call_close``. The arguments are encoded as ``args``: a JSON object (:attr:`Args.JSON`),
``<parameter=NAME>\\nVALUE\\n</parameter>\\n`` per property (:attr:`Args.XML`, strings raw, other
values JSON), or ``NAME=VALUE`` pairs joined by ``", "`` (:attr:`Args.PYTHONIC`, Python literals).

The grammar builder (:mod:`grammarserve.fsm.tools`), the one incremental parser
(:mod:`grammarserve.openai.toolparse_format`) and the renderer of past calls for templates
without tool support (:func:`calls_text`) all read this table; a new family is a new row.

``auto`` (free text, then calls): ``triggers`` are the texts that start the calls. With
``trigger_anywhere`` the free text ends at the first occurrence of the (single) trigger, which must
be a prefix of ``list_open + call_open``; otherwise the calls must start the reply (llama3_json's
``{`` or ``<|python_tag|>``, pythonic's ``[``, as vLLM's parsers read them) and a reply that starts
otherwise is plain text. A format without triggers has no ``auto`` mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Args(str, Enum):
    """How a call's arguments are written."""

    JSON = "json"  # one JSON object
    XML = "xml"  # <parameter=P>\nVALUE\n</parameter>\n per property (Qwen3-Coder)
    PYTHONIC = "pythonic"  # P=VALUE, ... with Python literals


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call text (see the module docstring)."""

    name: str
    call_open: str
    call_close: str
    name_close: str = ""  # after the name (unused when ``name_key`` is set)
    args: Args = Args.JSON
    name_key: str | None = None  # the call is a JSON object holding the name under this key
    args_key: str = "arguments"
    list_open: str = ""
    list_close: str = ""
    sep: str = ""  # between two calls (whitespace is allowed before it)
    joiner: str | None = None  # what the family writes between two calls, if not ``sep``
    json_array: bool = False  # the calls are one JSON array, separators as the JSON style's
    open_optional: bool = False  # ``list_open`` may be left out
    triggers: tuple[str, ...] = ()
    trigger_anywhere: bool = True
    single: bool = False  # one call per reply (the family stops after a call)
    #: Stop string ending a reply after its calls (a blank line after the closing tag), or None.
    stop: str | None = None
    families: str = ""  # the models and templates that write it (README)

    @property
    def has_auto(self) -> bool:
        return bool(self.triggers)

    @property
    def opening(self) -> str:
        """The text before the first call's name (or its JSON object)."""
        return self.list_open + self.call_open


HERMES = ToolFormat(
    "hermes", "<tool_call>\n", "\n</tool_call>", name_key="name", joiner="\n",
    triggers=("<tool_call>",), stop="</tool_call>\n\n",
    families="Qwen2.5, Qwen3, QwQ, Hermes 2/3, SmolLM3; templates without tool support (auto)")
JSON_ARRAY = ToolFormat(
    "json_array", "", "", name_key="name", args_key="parameters", list_open="[",
    list_close="]", sep=", ", json_array=True,
    families="templates without tool support (required / named, like vLLM)")
LLAMA3_JSON = ToolFormat(
    "llama3_json", "", "", name_key="name", args_key="parameters", list_open="<|python_tag|>",
    open_optional=True, sep="; ", triggers=("<|python_tag|>", "{"), trigger_anywhere=False,
    families="Llama 3.1, 3.2, 3.3")
MISTRAL = ToolFormat(
    "mistral", "", "", name_key="name", list_open="[TOOL_CALLS][", list_close="]", sep=", ",
    json_array=True, triggers=("[TOOL_CALLS]",),
    families="Mistral 7B v0.3, Mistral Nemo (pre-v11 tokenizers)")
MISTRAL_V11 = ToolFormat(
    "mistral_v11", "[TOOL_CALLS]", "", name_close="[ARGS]", triggers=("[TOOL_CALLS]",),
    families="Mistral Small 3.2, Magistral, Devstral, Ministral 3 (v11+ tokenizers)")
QWEN3_CODER = ToolFormat(
    "qwen3_coder", "<tool_call>\n<function=", "</function>\n</tool_call>", name_close=">\n",
    args=Args.XML, sep="\n", triggers=("<tool_call>",), stop="</tool_call>\n\n",
    families="Qwen3-Coder")
DEEPSEEK_V3 = ToolFormat(
    "deepseek_v3", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```<｜tool▁call▁end｜>",
    name_close="\n```json\n", list_open="<｜tool▁calls▁begin｜>", list_close="<｜tool▁calls▁end｜>",
    sep="\n", triggers=("<｜tool▁calls▁begin｜>",),
    families="DeepSeek V3, R1 (and R1 distills, llama.cpp's deepseek-r1 template)")
DEEPSEEK_V31 = ToolFormat(
    "deepseek_v31", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", name_close="<｜tool▁sep｜>",
    list_open="<｜tool▁calls▁begin｜>", list_close="<｜tool▁calls▁end｜>",
    triggers=("<｜tool▁calls▁begin｜>",), families="DeepSeek V3.1")
PYTHONIC = ToolFormat(
    "pythonic", "", ")", name_close="(", args=Args.PYTHONIC, list_open="[", list_close="]",
    sep=", ", triggers=("[",), trigger_anywhere=False,
    families="Llama 3.2 (pythonic template), Llama 4, ToolACE")
HARMONY = ToolFormat(
    "harmony", "<|channel|>commentary to=functions.", "<|call|>",
    name_close=" <|constrain|>json<|message|>", triggers=("<|channel|>commentary to=",),
    single=True, families="gpt-oss (harmony)")

#: Every format, by name (vLLM's ``--tool-call-parser`` names; ``harmony`` is vLLM's ``openai``).
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (
    HERMES, JSON_ARRAY, LLAMA3_JSON, MISTRAL, MISTRAL_V11, QWEN3_CODER, DEEPSEEK_V3,
    DEEPSEEK_V31, PYTHONIC, HARMONY)}
#: Other names of formats (vLLM's), resolved by :func:`tool_format`.
ALIASES = {"openai": "harmony", "qwen": "hermes", "llama4_pythonic": "pythonic",
           "deepseek_v3.1": "deepseek_v31"}


#: The markers that start tool calls anywhere in a reply (every format's triggers but those
#: only read at its start, like Llama's ``{`` and pythonic's ``[``): banned from a strict
#: reasoning span.
CALL_MARKERS: tuple[str, ...] = tuple(dict.fromkeys(
    t for f in FORMATS.values() if f.trigger_anywhere for t in f.triggers))


def tool_format(name: str) -> ToolFormat:
    """The format called ``name`` (or one of its :data:`ALIASES`); ``KeyError`` if none."""
    return FORMATS[ALIASES.get(name, name)]


def python_literal(value: Any) -> str:
    """``value`` (a JSON value) as a Python literal (pythonic calls)."""
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _xml_value(value: Any) -> str:
    """An XML parameter's value as Qwen3-Coder's template writes it (``|string`` of scalars,
    ``tojson`` of arrays and objects)."""
    if isinstance(value, str):
        return value
    if value is True or value is False or value is None:
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def args_text(fmt: ToolFormat, args: Any) -> str:
    """A call's arguments (a JSON value, normally an object) as ``fmt`` writes them."""
    if fmt.args is Args.XML and isinstance(args, dict):
        return "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n"
                       for k, v in args.items())
    if fmt.args is Args.PYTHONIC and isinstance(args, dict):
        return ", ".join(f"{k}={python_literal(v)}" for k, v in args.items())
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def call_text(fmt: ToolFormat, name: str, args: Any) -> str:
    """One call as ``fmt`` writes it (without the list's open and close)."""
    if fmt.name_key is not None:
        obj = (f'{{"{fmt.name_key}": {json.dumps(name, ensure_ascii=False)}, '
               f'"{fmt.args_key}": {args_text(fmt, args)}}}')
        return fmt.call_open + obj + fmt.call_close
    return fmt.call_open + name + fmt.name_close + args_text(fmt, args) + fmt.call_close


def calls_text(fmt: ToolFormat, calls: Iterable[tuple[str, Any]]) -> str:
    """``(name, arguments)`` calls as the reply text of ``fmt``."""
    sep = fmt.sep if fmt.joiner is None else fmt.joiner
    return fmt.list_open + sep.join(call_text(fmt, n, a) for n, a in calls) + fmt.list_close
