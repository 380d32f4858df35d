"""The loop guard inside the engine, on a tiny random-weight model (byte tokenizer: token id ==
byte): items that can only be one object, and a logit bias that makes the model always want
another item (``,``). Without the guard the array runs to ``max_tokens``; with it, the second
copy is taken back (output, text, KV), the array closes in the model's own tokens, the reply is
valid and the engine counts one cut."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from grammarserve.constraints import Constraint
from grammarserve.engine.engine import Engine
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

#: Every item is {"a":"x"}: each after the first is a copy.
SAME = {"type": "object", "properties": {"items": {"type": "array", "items": {
    "type": "object", "properties": {"a": {"const": "x"}}, "required": ["a"],
    "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False}
COMMA = ord(",")


def _engine(folder: Path, loop_guard: int) -> LLM:
    from grammarserve.config import EngineConfig

    return LLM.from_engine(Engine(EngineConfig(
        model=str(folder), device="cpu", kv_cache_tokens=2048, max_num_reqs=2,
        grammar_json_style="compact", loop_guard=loop_guard)))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny, tiny_tokenizer

    out: Path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny("llama", {}, out, tiny_tokenizer())
    return out


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=120, temperature=0, logit_bias={COMMA: 50.0},
                          constraint=Constraint.json_schema(SAME))


@pytest.mark.parametrize("loop_guard, items", [(1, 1), (2, 2)])
def test_the_guard_closes_a_copied_array(folder: Path, loop_guard: int, items: int) -> None:
    llm = _engine(folder, loop_guard)
    out = llm.generate([[104, 105, 10]], _params())[0]
    assert out.finish_reason == "stop", out.text
    value = json.loads(out.text)
    jsonschema.validate(value, SAME)
    assert value == {"items": [{"a": "x"}] * items}
    assert bytes(out.token_ids[:len(out.text)]).decode() == out.text  # the copy went back
    assert llm.engine.stats().loop_guard_cuts == 1


def test_without_the_guard_the_array_runs_on(folder: Path) -> None:
    llm = _engine(folder, 0)
    out = llm.generate([[104, 105, 10]], _params())[0]
    assert out.finish_reason == "length"
    assert out.text.count('{"a":"x"}') > 5
    assert llm.engine.stats().loop_guard_cuts == 0


def test_the_stream_never_shows_the_copy(folder: Path) -> None:
    """Streamed deltas add up to the final text: the copy taken back was held, never sent; the
    KV pool is whole afterwards."""
    llm = _engine(folder, 2)
    engine = llm.engine
    engine.add_request("s", [104, 105, 10], _params())
    deltas, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            deltas.append(out.delta_text)
            final = out if out.finished else final
    assert final is not None and final.finish_reason == "stop"
    assert "".join(deltas) == final.text
    assert json.loads(final.text) == {"items": [{"a": "x"}] * 2}
    pool, cache = engine.runner.pool, engine.cache
    assert pool.num_free + (cache.total_tokens if cache is not None else 0) == pool.capacity
