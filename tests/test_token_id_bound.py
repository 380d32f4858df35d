"""Token ids have one bound, the model's ``vocab_size`` (``grammarserve.engine.validate``), on
every path: the engine's prompts and ``logit_bias``, the protocol layer's completion prompts and
``logit_bias`` keys, and the server's ``/detokenize``. A tiny random-weight model with 264 rows
and the 256-token byte tokenizer: an id between the two (260) is taken everywhere, 264 refused
everywhere with the same message naming the parameter and the bound."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2
import pytest

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.errors import InvalidRequestError
from grammarserve.llm import LLM
from grammarserve.openai import ModelContext, prepare_body
from grammarserve.sampling_params import SamplingParams
from grammarserve.server import create_app
from grammarserve.server.config import ServerConfig
from grammarserve.server.state import ServerState

ROWS = 264  # the model's vocab_size; the tokenizer has 256 tokens
BETWEEN, OUTSIDE = 260, ROWS
MESSAGE = "token ids must be in [0, 264) (the model's vocab_size), got 264"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    from tiny_models import build_tiny, tiny_tokenizer

    folder: Path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny("llama", {"vocab_size": ROWS}, folder, tiny_tokenizer())
    return Engine(EngineConfig(model=str(folder), device="cpu", kv_cache_tokens=1024,
                               max_num_reqs=2))


@pytest.fixture(scope="module")
def ctx(engine: Engine) -> ModelContext:
    return ModelContext.create(engine.tokenizer, engine.grammar.compiler, max_model_len=512,
                               max_n=1, model_name="m", vocab_size=engine.vocab_size)


def test_the_bounds_differ(engine: Engine) -> None:
    assert len(engine.tokenizer) == 256 < BETWEEN < engine.vocab_size == ROWS


def test_engine_prompts_and_biases(engine: Engine) -> None:
    llm = LLM.from_engine(engine)
    out = llm.generate([[104, BETWEEN]], SamplingParams(max_tokens=2, temperature=0,
                                                        logit_bias={BETWEEN: -1.0}))[0]
    assert out.prompt_token_ids == [104, BETWEEN] and len(out.token_ids) == 2
    for prompt, bias, param in (([104, OUTSIDE], None, "prompt"),
                                ([104], {OUTSIDE: 1.0}, "logit_bias")):
        with pytest.raises(InvalidRequestError) as e:
            engine.add_request("x", prompt, SamplingParams(max_tokens=2, logit_bias=bias))
        assert e.value.param == param and str(e.value) == f"{param} {MESSAGE}"
    assert not engine.has_unfinished()


def test_protocol_prompts_and_biases(ctx: ModelContext) -> None:
    body = {"model": "m", "max_tokens": 2}
    ok = prepare_body(ctx, COMPLETIONS, {**body, "prompt": [104, BETWEEN],
                                         "logit_bias": {str(BETWEEN): 1}})
    assert ok.prompts == [[104, BETWEEN]] and dict(ok.params[0].logit_bias or {}) == {
        BETWEEN: 1.0}
    for fields, param in (({"prompt": [104, OUTSIDE]}, "prompt"),
                          ({"prompt": [104], "logit_bias": {str(OUTSIDE): 1}}, "logit_bias")):
        with pytest.raises(InvalidRequestError) as e:
            prepare_body(ctx, COMPLETIONS, {**body, **fields})
        assert e.value.param == param and str(e.value) == f"{param} {MESSAGE}"


def test_server_detokenize(engine: Engine, tmp_path: Path) -> None:
    class Alive:
        alive = True

    state = ServerState(ServerConfig(engine=EngineConfig(model="/nonexistent"),
                                     data_dir=tmp_path))
    state.engine = Alive()  # type: ignore[assignment]
    state._ready(engine.tokenizer, engine.grammar.compiler, {  # the engine's info, as sent
        "max_model_len": 512, "model_folder": "m", "vocab_size": engine.vocab_size})
    app = create_app(state.config, state=state)

    async def post(tokens: list[int]) -> Any:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://test") as http:
            return await http.post("/detokenize", json={"tokens": tokens})

    try:
        ok = asyncio.run(post([104, BETWEEN]))
        assert ok.status_code == 200 and ok.json() == {"prompt": "h"}
        bad = asyncio.run(post([104, OUTSIDE]))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        assert bad.json()["error"]["message"] == f"tokens {MESSAGE}"
    finally:
        state.status = "failed"  # lets an idle batch worker thread end
