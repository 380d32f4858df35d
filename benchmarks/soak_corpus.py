"""The soak benchmark's traffic: what a careless or hostile client sends (malformed bodies, wrong
types, bad schemas / regexes / grammars / tools, out-of-range sampling values, huge inputs, aborted
streams, file and batch abuse) and ordinary valid requests.

Each :class:`Case` is one HTTP request and the statuses it should get; :func:`cases` builds the
whole corpus (some bodies are megabytes: they are built once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FOUR_XX = frozenset(range(400, 500))
OK = frozenset({200})


@dataclass(frozen=True)
class Case:
    """One request: ``body`` (JSON) or ``raw`` bytes to ``path``; ``expect`` the statuses it
    should get. ``abort``: read the first bytes of the (streamed) reply, then hang up."""

    name: str
    path: str
    body: Any = None
    raw: bytes | None = None
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    expect: frozenset[int] = FOUR_XX
    abort: bool = False
    chunked: bool = False

    @property
    def valid(self) -> bool:
        return self.expect == OK


def chat(content: str = "Say hi.", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": content}], **extra}


def fmt(schema: Any, strict: bool = False) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": "out", "schema": schema, "strict": strict}}}


def tool(parameters: Any, name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def nested_schema_body(depth: int) -> bytes:
    """A chat body whose schema is ``{"type": "object", "properties": {"a": ...}}`` ``depth``
    levels deep (written as text: ``json.dumps`` itself recurses)."""
    schema = ('{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}'
              + '}, "required": ["a"]}' * depth)
    return json.dumps(chat(**fmt("@SCHEMA@"))).replace('"@SCHEMA@"', schema).encode()


#: A ``$ref`` cycle with no base case (issue 20: it took the engine's memory until OOM).
REF_CYCLE = {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                             "required": ["x"]}}, "$ref": "#/$defs/a"}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = tool({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                "required": ["city"], "additionalProperties": False}, "get_weather")


def _malformed() -> list[Case]:
    deep_json = ("[" * 100_000 + "]" * 100_000).encode()
    return [
        Case("truncated_json", CHAT, raw=b'{"model": "m", "messages": ['),
        Case("empty_body", CHAT, raw=b""),
        Case("json_array", CHAT, raw=b"[]"),
        Case("json_string", CHAT, raw=b'"hello"'),
        Case("invalid_utf8", CHAT, raw=b'{"model": "m", "messages": [{"role": "user", '
                                        b'"content": "\xff\xfe"}]}'),
        Case("nul_bytes", CHAT, raw=b'{"model": "m",\x00 "messages": []}'),
        Case("text_plain", CHAT, raw=json.dumps(chat()).encode(),
             headers={"Content-Type": "text/plain"}),
        Case("deep_request_json", CHAT, raw=b'{"model": "m", "messages": ' + deep_json + b"}"),
        Case("deep_metadata_json", CHAT, raw=json.dumps(chat())[:-1].encode()
             + b', "metadata": ' + deep_json + b"}"),
        Case("lone_surrogate", CHAT, raw=b'{"model": "m", "messages": [{"role": "user", '
                                         b'"content": "\\ud800"}]}'),
    ]


def _wrong_types() -> list[Case]:
    bad: list[tuple[str, dict[str, Any]]] = [
        ("messages_string", {"messages": "hi"}), ("messages_ints", {"messages": [1, 2]}),
        ("max_tokens_string", {"max_tokens": "x"}), ("temperature_string", {"temperature": "hot"}),
        ("n_float", {"n": 1.5}), ("stop_int", {"stop": 5}), ("model_int", {"model": 5}),
        ("tools_object", {"tools": {}}), ("response_format_string", {"response_format": "json"}),
        ("role_unknown", {"messages": [{"role": "robot", "content": "x"}]}),
        ("content_image", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
        ("messages_empty", {"messages": []}),
    ]
    return [Case(name, CHAT, {**chat(), **patch}) for name, patch in bad]


def _bad_constraints() -> list[Case]:
    schemas: list[tuple[str, Any]] = [
        ("schema_unknown_type", {"type": "foo"}),
        ("schema_remote_ref", {"$ref": "https://example.com/s.json"}),
        ("schema_missing_ref", {"$ref": "#/$defs/nope"}),
        ("schema_ref_cycle", REF_CYCLE),
        ("schema_bad_pattern", {"type": "string", "pattern": "(unclosed"}),
        ("schema_min_over_max", {"type": "string", "minLength": 5, "maxLength": 2}),
        ("schema_empty_not", {"not": {}}),
        ("schema_not_object", [1, 2]),
        ("schema_required_string", {"type": "object", "required": "a"}),
        ("schema_strict_violation", {"type": "object", "properties": {"a": {"type": "string"}}}),
    ]
    out = [Case(name, CHAT, chat(**fmt(s, strict=name.endswith("violation"))))
           for name, s in schemas]
    out += [Case(f"schema_deep_{d}", CHAT, raw=nested_schema_body(d)) for d in (300, 2000)]
    out += [Case(f"regex_{i}", CHAT, chat(regex=r)) for i, r in enumerate(
        ["(", "a{99999999}", "[z-a]", "(?<=a)b", "\\"])]
    out += [Case(f"grammar_{i}", CHAT, chat(grammar=g)) for i, g in enumerate(
        ["start: foo", "garbage ::= ", "", "start: start", "start: /[/"])]
    out += [Case("choice_empty", CHAT, chat(choice=[])),
            Case("two_constraints", CHAT, chat(regex="a", choice=["a"]))]
    tools: list[tuple[str, dict[str, Any]]] = [
        ("tool_params_string", {"tools": [tool({"type": "string"})], "tool_choice": "required"}),
        ("tool_no_name", {"tools": [{"type": "function", "function": {"parameters": {}}}]}),
        ("tool_name_spaces", {"tools": [tool({"type": "object"}, "a b")],
                              "tool_choice": "required"}),
        ("tool_duplicate", {"tools": [WEATHER, WEATHER], "tool_choice": "required"}),
        ("tool_choice_unknown", {"tools": [WEATHER], "tool_choice": {
            "type": "function", "function": {"name": "nope"}}}),
        ("tool_choice_no_tools", {"tool_choice": "required"}),
        ("tool_bad_schema", {"tools": [tool({"type": "object", "properties": {
            "x": {"type": "integr"}}})], "tool_choice": "required"}),
    ]
    out += [Case(name, CHAT, chat(**patch)) for name, patch in tools]
    return out


def _bad_sampling() -> list[Case]:
    values: list[tuple[str, dict[str, Any]]] = [
        ("temperature_negative", {"temperature": -1}), ("temperature_huge", {"temperature": 1e9}),
        ("top_p_2", {"top_p": 2}), ("top_k_negative", {"top_k": -5}), ("n_0", {"n": 0}),
        ("n_1000", {"n": 1000}), ("max_tokens_0", {"max_tokens": 0}),
        ("max_tokens_negative", {"max_tokens": -1}), ("max_tokens_huge", {"max_tokens": 10**9}),
        ("top_logprobs_50", {"logprobs": True, "top_logprobs": 50}),
        ("logit_bias_key", {"logit_bias": {"abc": 1}}),
        ("logit_bias_id", {"logit_bias": {"99999999": 1}}),
        ("logit_bias_value", {"logit_bias": {"5": 1000}}), ("seed_string", {"seed": "x"}),
        ("presence_penalty_5", {"presence_penalty": 5}), ("min_p_2", {"min_p": 2}),
        ("stop_many", {"stop": [str(i) for i in range(100)]}),
        ("stream_options_without_stream", {"stream_options": {"include_usage": True}}),
    ]
    return [Case(name, CHAT, {**chat(), **patch}) for name, patch in values]


def _huge() -> list[Case]:
    return [
        Case("body_10mb", CHAT, raw=json.dumps(chat("x" * 10**7)).encode()),
        Case("body_10mb_chunked", CHAT, raw=json.dumps(chat("x" * 10**7)).encode(),
             chunked=True),
        Case("prompt_1m_chars", CHAT, chat("y" * 10**6)),
        Case("completion_600_prompts", COMPLETIONS, {"model": "m", "prompt": ["a"] * 600,
                                                     "max_tokens": 1}),
        Case("completion_40_by_16", COMPLETIONS, {"model": "m", "prompt": ["a"] * 40, "n": 16,
                                                  "max_tokens": 1}),
        Case("token_prompt_over_context", COMPLETIONS, {"model": "m", "prompt": [5] * 20_000}),
        Case("token_ids_out_of_vocab", COMPLETIONS, {"model": "m", "prompt": [10**9]}),
    ]


def _files() -> list[Case]:
    def multipart(purpose: str, data: bytes) -> bytes:
        return (b'--S\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
                + purpose.encode() + b'\r\n--S\r\nContent-Disposition: form-data; name="file"; '
                b'filename="a.jsonl"\r\n\r\n' + data + b"\r\n--S--\r\n")

    form = {"Content-Type": "multipart/form-data; boundary=S"}
    return [
        Case("upload_bad_purpose", "/v1/files", raw=multipart("nope", b"{}\n"), headers=form),
        Case("upload_not_multipart", "/v1/files", raw=b"{}"),
        Case("upload_no_file", "/v1/files", raw=b'--S\r\nContent-Disposition: form-data; '
             b'name="purpose"\r\n\r\nbatch\r\n--S--\r\n', headers=form),
        Case("upload_truncated", "/v1/files", raw=multipart("batch", b"{}\n")[:-10],
             headers=form),
        Case("upload_declared_300mb", "/v1/files", raw=b"x" * 1000,
             headers={**form, "Content-Length": str(300 * 2**20)}),
        Case("file_dotdot", "/v1/files/..%2F..%2Fetc%2Fpasswd/content", method="GET"),
        Case("file_nul", "/v1/files/file-%00/content", method="GET"),
        Case("batch_unknown_file", "/v1/batches", {"input_file_id": "file-nope",
                                                   "endpoint": CHAT,
                                                   "completion_window": "24h"}),
        Case("batch_unknown", "/v1/batches/batch_nope", method="GET"),
    ]


def _valid() -> list[Case]:
    return [
        Case("ok_chat", CHAT, chat("Name a fruit."), expect=OK),
        Case("ok_schema", CHAT, chat("Invent a person.", max_tokens=48, **fmt(PERSON, True)),
             expect=OK),
        Case("ok_regex", CHAT, chat("A date?", regex=r"\d{4}-\d{2}-\d{2}"), expect=OK),
        Case("ok_choice", CHAT, chat("Yes or no?", choice=["yes", "no"]), expect=OK),
        Case("ok_tools", CHAT, chat("Weather in Oslo?", max_tokens=32, tools=[WEATHER],
                                    tool_choice="required"), expect=OK),
        Case("ok_stream", CHAT, chat("Count to five.", stream=True), expect=OK),
        Case("ok_completion", COMPLETIONS, {"model": "m", "prompt": "Once upon a time",
                                            "max_tokens": 12, "n": 2}, expect=OK),
        Case("aborted_stream", CHAT, chat("Write a long story.", max_tokens=256, stream=True),
             expect=OK, abort=True),
        Case("aborted_schema_stream", CHAT, chat("Invent a person.", max_tokens=64,
                                                 stream=True, **fmt(PERSON, True)),
             expect=OK, abort=True),
        Case("ok_models", "/v1/models", method="GET", expect=OK),
    ]


def cases() -> list[Case]:
    """The whole corpus: bad input of every kind, then valid requests."""
    return [*_malformed(), *_wrong_types(), *_bad_constraints(), *_bad_sampling(), *_huge(),
            *_files(), *_valid()]
