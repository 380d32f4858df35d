"""OpenAI sampling controls at the API: penalties, logit_bias, logprobs / top_logprobs in chat,
completions and batch lines (every path prepares requests with the protocol layer, so a line
gets the 400 the server would give), the response shapes of reference/openai-api.md, and one end to
end check on the embedded model."""

from __future__ import annotations

from typing import Any

import pytest

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import InvalidRequestError
from grammarserve.llm import LLM
from grammarserve.openai import ModelContext, error_response, prepare_body, reply_body
from grammarserve.openai.logprobs import TokenTexts

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def byte_tokenizer() -> Any:
    """The tiny byte-level tokenizer (token id == byte, 256 tokens) with a plain chat
    template."""
    from tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    return tok


@pytest.fixture(scope="module")
def ctx(byte_tokenizer: Any) -> ModelContext:
    return ModelContext.create(byte_tokenizer, None, max_model_len=512, max_n=4, model_name="m",
                               vocab_size=256)


def _body(url: str, **fields: Any) -> dict[str, Any]:
    base = {"messages": MESSAGES} if url == CHAT else {"prompt": "hi"}
    return {"model": "m", **base, **fields}


@pytest.mark.parametrize(("url", "fields", "param"), [
    (CHAT, {"frequency_penalty": 2.5}, "frequency_penalty"),
    (COMPLETIONS, {"presence_penalty": -2.01}, "presence_penalty"),
    (CHAT, {"repetition_penalty": 0}, "repetition_penalty"),
    (COMPLETIONS, {"repetition_penalty": -1.0}, "repetition_penalty"),
    (CHAT, {"repetition_penalty": 101}, "repetition_penalty"),
    (CHAT, {"logit_bias": {"abc": 5}}, "logit_bias"),
    (CHAT, {"logit_bias": {"-3": 5}}, "logit_bias"),
    (CHAT, {"logit_bias": {"1.5": 5}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"256": 5}}, "logit_bias"),  # outside the 256-token vocab
    (CHAT, {"logit_bias": {"5": 100.5}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"5": -101}}, "logit_bias"),
    (CHAT, {"logit_bias": {"5": "much"}}, "logit_bias.5"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"top_logprobs": 3}, "top_logprobs"),  # without logprobs=true
    (CHAT, {"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    (COMPLETIONS, {"logprobs": 6}, "logprobs"),  # OpenAI's completions limit is 5
])
def test_out_of_range_controls_are_a_400_naming_the_param(
        ctx: ModelContext, url: str, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        prepare_body(ctx, url, _body(url, **fields))
    status, body = error_response(e.value)
    assert status == 400
    err = body["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert param.split(".")[0] in err["message"]


def test_controls_reach_the_sampling_params(ctx: ModelContext) -> None:
    chat = prepare_body(ctx, CHAT, _body(
        CHAT, frequency_penalty=0.5, presence_penalty=-0.25, repetition_penalty=1.2,
        logit_bias={"7": -100, "65": 3.5}, logprobs=True, top_logprobs=20, n=2))
    for p in chat.params:
        assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.5, -0.25,
                                                                                   1.2)
        assert dict(p.logit_bias or {}) == {7: -100.0, 65: 3.5} and p.top_logprobs == 20
    plain = prepare_body(ctx, CHAT, _body(CHAT, logprobs=True)).params[0]
    assert (plain.top_logprobs, plain.logit_bias, plain.repetition_penalty) == (0, None, 1.0)
    assert not plain.uses_controls
    comp = prepare_body(ctx, COMPLETIONS, _body(COMPLETIONS, logprobs=3, logit_bias={}))
    assert comp.params[0].top_logprobs == 3 and not comp.params[0].uses_controls


def _output(token_ids: list[int], logprobs: list[float],
            tops: list[list[tuple[int, float]]]) -> RequestOutput:
    return RequestOutput("r", [104], token_ids, bytes(token_ids).decode(), "", True, "stop",
                         logprobs=logprobs, top_logprobs=tops)


def test_response_shapes(ctx: ModelContext) -> None:
    """Chat: ``logprobs.content[i].top_logprobs`` = [{token, logprob, bytes}]; completions:
    ``logprobs.top_logprobs`` = [{token: logprob}] (null when logprobs=0)."""
    out = _output([104, 105], [-0.1, -0.2],
                  [[(104, -0.1), (97, -2.5)], [(105, -0.2), (0xC3, -3.0)]])
    chat = prepare_body(ctx, CHAT, _body(CHAT, logprobs=True, top_logprobs=2))
    content = reply_body(ctx, chat, [out])["choices"][0]["logprobs"]["content"]
    assert content[0] == {"token": "h", "logprob": -0.1, "bytes": [104], "top_logprobs": [
        {"token": "h", "logprob": -0.1, "bytes": [104]},
        {"token": "a", "logprob": -2.5, "bytes": [97]}]}
    assert content[1]["top_logprobs"][1]["bytes"] == [0xC3]  # part of a character: raw bytes
    comp = prepare_body(ctx, COMPLETIONS, _body(COMPLETIONS, logprobs=2))
    lp = reply_body(ctx, comp, [out])["choices"][0]["logprobs"]
    assert lp["tokens"] == ["h", "i"] and lp["token_logprobs"] == [-0.1, -0.2]
    assert lp["top_logprobs"] == [{"h": -0.1, "a": -2.5}, {"i": -0.2, "\ufffd": -3.0}]
    zero = prepare_body(ctx, COMPLETIONS, _body(COMPLETIONS, logprobs=0))
    assert reply_body(ctx, zero, [out])["choices"][0]["logprobs"]["top_logprobs"] is None


def test_streamed_chat_logprobs_slice_the_top_lists(byte_tokenizer: Any) -> None:
    texts = TokenTexts(byte_tokenizer)
    tops = [[(104, -0.1)], [(105, -0.2), (106, -1.9)]]
    entries = texts.chat_logprobs([104, 105][1:], [-0.1, -0.2][1:], tops[1:])
    assert [t["token"] for t in entries[0]["top_logprobs"]] == ["i", "j"]
    assert texts.chat_logprobs([104], [-0.1])[0]["top_logprobs"] == []


# -- end to end on the embedded model (the protocol layer every path uses) ----------------------
@pytest.mark.model
def test_logit_bias_and_top_logprobs_on_the_embedded_model(llm: LLM) -> None:
    ctx = ModelContext.create(llm.tokenizer, None, max_model_len=2048, max_n=4, model_name="m")
    ask = [{"role": "user", "content": "Name a colour."}]

    def run(**fields: Any) -> tuple[dict[str, Any], RequestOutput]:
        prep = prepare_body(ctx, CHAT, {"model": "m", "messages": ask, "max_tokens": 6,
                                        "temperature": 0, "logprobs": True, **fields})
        outs = llm.generate(prep.prompts, prep.params)
        return dict(reply_body(ctx, prep, outs)["choices"][0]), outs[0]

    first, out = run(top_logprobs=5)
    content = first["logprobs"]["content"]
    assert len(content) == len(out.token_ids) >= 2
    assert all(len(c["top_logprobs"]) == 5 for c in content)
    for c in content:  # greedy: the chosen token heads its own top list
        assert c["top_logprobs"][0]["token"] == c["token"]
        assert c["top_logprobs"][0]["logprob"] == pytest.approx(c["logprob"], abs=1e-4)
        lps = [t["logprob"] for t in c["top_logprobs"]]
        assert lps == sorted(lps, reverse=True)
    banned, again = run(logit_bias={str(out.token_ids[0]): -100})
    assert again.token_ids[0] != out.token_ids[0]
    assert banned["message"]["content"] != first["message"]["content"]
