"""Reasoning formats, the reply splitter and the request parameters, without the model:
detection from the vendored chat templates, where each rendered prompt leaves the span, the
split of a stream (any cut into deltas) equal to the split of the whole, and the 400s."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from grammarserve.errors import InvalidRequestError
from grammarserve.fsm.reasoning_formats import PromptState, by_name, detect, resolve
from grammarserve.models.loader import load_tokenizer, resolve_model_folder
from grammarserve.openai.context import ModelContext
from grammarserve.openai.errors import validation_error
from grammarserve.openai.prepare import prepare_chat
from grammarserve.openai.protocol import ChatCompletionRequest, ChatMessage
from grammarserve.openai.reasoning_split import ReasoningSplitter, split
from grammarserve.openai.render import render_chat
from grammarserve.openai.responses_request import ResponsesRequest

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN3 = by_name("qwen3")
GPT_OSS = by_name("gpt_oss")
MISTRAL = by_name("mistral")


@pytest.mark.parametrize(("name", "expected"), [
    ("Qwen-Qwen3-0.6B", "qwen3"), ("Qwen-QwQ-32B", "qwen3"), ("HuggingFaceTB-SmolLM3-3B", "qwen3"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek_r1"),
    ("llama-cpp-deepseek-r1", "deepseek_r1"), ("deepseek-ai-DeepSeek-V3.1", "deepseek_v3"),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral"),
    ("openai-gpt-oss-120b", "openai_gptoss"), ("Qwen-Qwen2.5-7B-Instruct", None),
    ("Qwen3-Coder", None), ("meta-llama-Llama-3.1-8B-Instruct", None),
    ("mistralai-Mistral-Nemo-Instruct-2407", None),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", None)])
def test_detect_from_the_template(name: str, expected: str | None) -> None:
    found = detect((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"))
    assert (found.name if found else None) == expected


def test_the_parser_flag_overrides_detection() -> None:
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    assert resolve(None, template) is QWEN3
    assert resolve("none", template) is None
    assert resolve("gpt-oss", None) is GPT_OSS
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'"):
        resolve("nope", template)


@pytest.mark.parametrize(("fmt", "prompt", "state"), [
    (QWEN3, "<|im_start|>assistant\n", PromptState.NONE),
    (QWEN3, "<|im_start|>assistant\n<think>\n", PromptState.OPEN),
    (QWEN3, "<|im_start|>assistant\n<think>\n\n</think>\n\n", PromptState.CLOSED),
    (QWEN3, "<｜Assistant｜><think></think>", PromptState.CLOSED),
    (MISTRAL, "[SYSTEM_PROMPT]use [THINK]x[/THINK] then.[/SYSTEM_PROMPT][INST]hi[/INST]",
     PromptState.NONE),
    (GPT_OSS, "<|start|>user<|message|>hi<|end|><|start|>assistant", PromptState.NONE)])
def test_prompt_state(fmt: Any, prompt: str, state: PromptState) -> None:
    assert fmt.prompt_state(prompt) is state


REPLIES = [
    (QWEN3, False, "<think>\nLet me see: {\"a\" is 1}.\n</think>\n\n{\"a\": 1}",
     "Let me see: {\"a\" is 1}.", "{\"a\": 1}"),
    (QWEN3, True, "I reason here </thi and go on.\n</think>\n\nYes.",
     "I reason here </thi and go on.", "Yes."),
    (QWEN3, False, "No thinking at all.", None, "No thinking at all."),
    (QWEN3, False, "<think>\ncut off by max_tokens", "cut off by max_tokens", ""),
    (QWEN3, False, "<think>\nx\n</think>\nonly one newline", "x", "only one newline"),
    (GPT_OSS, False, ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
                      "<|channel|>final<|message|>{\"k\": []}"), "Think.", "{\"k\": []}"),
    (MISTRAL, False, "[THINK]short[/THINK]Answer.", "short", "Answer."),
]


@pytest.mark.parametrize(("fmt", "opened", "text", "reasoning", "content"), REPLIES)
def test_split_whole_and_streamed(fmt: Any, opened: bool, text: str, reasoning: str | None,
                                  content: str) -> None:
    got = split(fmt, text, opened=opened)
    assert got[:2] == (reasoning, content)
    for cut in range(len(text) + 1):  # NOTE: every cut, so markers split across deltas too
        for size in (1, 3):
            s = ReasoningSplitter(fmt, opened=opened)
            parts = [s.feed(text[:cut])]
            parts += [s.feed(text[i:i + size]) for i in range(cut, len(text), size)]
            parts.append(s.finish())
            assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (
                reasoning or "", content), (cut, size)


def test_where_the_content_begins() -> None:
    text = "<think>\nx\n</think>\n\n{}"
    assert split(QWEN3, text, opened=False)[2] == text.index("{")
    assert split(QWEN3, "<think>\nno end", opened=False)[2] is None


class _Template:
    """A stand-in tokenizer: renders the Qwen3 template's generation prompt switch only."""

    chat_template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")

    def __len__(self) -> int:
        return 1000

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tokenize: bool,
                            add_generation_prompt: bool, **kwargs: Any) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
            if kwargs.get("enable_thinking") is False:
                text += "<think>\n\n</think>\n\n"
        return text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


def _prepare(tokenizer: Any = None, **body: Any) -> Any:
    ctx = ModelContext.create(tokenizer or _Template(), None, max_model_len=512, max_n=4,
                              model_name="m", max_prompt_chars=10_000)
    return prepare_chat(ctx, ChatCompletionRequest.model_validate({**copy.deepcopy(BODY),
                                                                   **body}))


def test_a_budget_reaches_the_engine() -> None:
    prep = _prepare(thinking_token_budget=7)
    span = prep.params[0].reasoning
    assert span is not None and span.budget == 7 and span.open == "<think>\n"
    assert span.end == "</think>" and span.after == "\n\n"
    assert _prepare(reasoning_effort="low").params[0].reasoning.budget == 512
    assert _prepare(reasoning_effort="low", thinking_budget=3).params[0].reasoning.budget == 3
    assert _prepare(custom_params={"thinking_budget": 4}).params[0].reasoning.budget == 4


def test_unconstrained_without_a_budget_is_only_split() -> None:
    prep = _prepare()
    assert prep.reasoning is not None and prep.params[0].reasoning is None


def test_enable_thinking_false_closes_the_span_in_the_template() -> None:
    prep = _prepare(chat_template_kwargs={"enable_thinking": False})
    assert prep.reasoning is None and prep.params[0].reasoning is None
    assert _prepare(reasoning_effort="none").reasoning is None


def test_strict_thinking_bans_the_tool_trigger() -> None:
    span = _prepare(strict_thinking=True).params[0].reasoning
    assert span is not None and span.strict and "<tool_call>" in span.banned


@pytest.mark.parametrize(("body", "param"), [
    ({"thinking_token_budget": -1}, "thinking_token_budget"),
    ({"thinking_budget": "many"}, "thinking_budget"),
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
    ({"thinking_token_budget": 5, "thinking_budget": 6}, "thinking_budget"),
    ({"custom_params": {"thinking_budget": -2}}, "custom_params.thinking_budget"),
    # NOTE: no coercion: a string, a bool or a float is not a budget
    ({"thinking_token_budget": "10"}, "thinking_token_budget"),
    ({"thinking_token_budget": True}, "thinking_token_budget"),
    ({"thinking_token_budget": 10.5}, "thinking_token_budget"),
    ({"thinking_token_budget": 10.0}, "thinking_token_budget"),
    ({"thinking_budget": "10"}, "thinking_budget"),
    ({"thinking_budget": True}, "thinking_budget"),
    ({"thinking_budget": 2.5}, "thinking_budget"),
    ({"thinking_budget": -3}, "thinking_budget"),
    ({"custom_params": {"thinking_budget": "10"}}, "custom_params.thinking_budget"),
    ({"custom_params": {"thinking_budget": True}}, "custom_params.thinking_budget"),
    ({"custom_params": {"thinking_budget": 1.5}}, "custom_params.thinking_budget"),
    ({"reasoning_effort": "none", "thinking_budget": 5}, "thinking_budget"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
])
def test_bad_reasoning_parameters_name_themselves(body: dict[str, Any], param: str) -> None:
    try:
        _prepare(**body)
    except InvalidRequestError as e:
        assert e.param == param
    except ValidationError as e:
        assert validation_error(e.errors()).param == param
    else:
        pytest.fail(f"{body} was accepted")


@pytest.mark.parametrize("param", ["thinking_token_budget", "thinking_budget"])
@pytest.mark.parametrize("value", ["10", True, False, 10.5, -1])
def test_a_responses_budget_that_is_not_an_integer_names_itself(param: str, value: Any) -> None:
    with pytest.raises(ValidationError) as e:
        ResponsesRequest.model_validate({"model": "m", "input": "hi", param: value})
    assert validation_error(e.value.errors()).param == param
    assert getattr(ResponsesRequest.model_validate({"model": "m", "input": "hi", param: 10}),
                   param) == 10


def test_a_budget_without_a_reasoning_model_is_refused() -> None:
    plain = _Template()
    plain.chat_template = "{{ messages }}"  # type: ignore[misc]
    with pytest.raises(InvalidRequestError, match="--reasoning-parser") as e:
        _prepare(plain, thinking_token_budget=5)
    assert e.value.param == "thinking_token_budget"
    assert _prepare(plain, reasoning_effort="high").reasoning is None  # NOTE: ignored


def test_past_thoughts_reach_templates_that_render_them() -> None:
    """An assistant turn's reasoning_content (or reasoning) goes back to the template: Qwen3's
    writes it in the turns after the last user message (a tool-call loop)."""
    tok = load_tokenizer(resolve_model_folder("default"),
                         str(Path(__file__).parent / "data" / "templates" /
                             "Qwen-Qwen3-0.6B.jinja"))
    for key in ("reasoning_content", "reasoning"):
        history = [ChatMessage.model_validate(m) for m in [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": None, key: "I should look it up.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]]
        text = render_chat(tok, history)
        assert "<think>\nI should look it up.\n</think>" in text
