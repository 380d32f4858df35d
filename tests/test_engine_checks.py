"""Value checks inside the engine, on a tiny random-weight model (byte tokenizer: token id ==
byte; no weights to download): a failed check takes the value's tokens back (output, text, KV,
prefix-cache locks), counts a retry, and after the retries ends the request with an error; the
streamed text never shows what was taken back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from grammarserve.constraints import Constraint
from grammarserve.engine.engine import Engine
from grammarserve.engine.request import RequestOutput
from grammarserve.errors import ErrorKind
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

#: Items can only be "a" (the grammar does not know: a pattern is an open domain), so two
#: distinct items never come: every second item fails its check until the retries run out or
#: no token is left to try.
IMPOSSIBLE = {"type": "array", "items": {"type": "string", "pattern": "^a$"}, "minItems": 2,
              "uniqueItems": True}
#: Two distinct items of "a", "b": repeats are retried until the other letter comes.
PAIR = {"type": "array", "items": {"type": "string", "pattern": "^[ab]$"}, "minItems": 2,
        "maxItems": 2, "uniqueItems": True}
NOT = {"type": "object", "properties": {"k": {"type": "string", "maxLength": 2,
                                              "not": {"pattern": "^[a-m]"}}},
       "required": ["k"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    from tiny_models import build_tiny, tiny_tokenizer

    from grammarserve.config import EngineConfig

    folder: Path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny("llama", {}, folder, tiny_tokenizer())
    return LLM.from_engine(Engine(EngineConfig(model=str(folder), device="cpu",
                                               kv_cache_tokens=2048, max_num_reqs=4,
                                               grammar_check_retries=5)))


def _params(schema: dict[str, Any], *, jump_forward: bool = True,
            temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=120, temperature=temperature, seed=seed,
                          jump_forward=jump_forward, constraint=Constraint.json_schema(schema))


def _stream(engine: Engine, rid: str, prompt: list[int], params: SamplingParams
            ) -> tuple[str, RequestOutput]:
    """Run one request alone; the concatenated deltas and the final output."""
    engine.add_request(rid, prompt, params)
    deltas, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            deltas.append(out.delta_text)
            final = out if out.finished else final
    assert final is not None
    return "".join(deltas), final


def _text_of(llm: LLM, out: RequestOutput) -> str:
    """The text of the output tokens (the stop token, byte 2 here, is not text)."""
    ids = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
    return str(llm.tokenizer.decode(ids))


def _pool_is_whole(engine: Engine) -> None:
    pool, cache = engine.runner.pool, engine.cache
    assert pool.num_free + (cache.total_tokens if cache is not None else 0) == pool.capacity


@pytest.mark.parametrize("jump_forward", [True, False])
def test_retries_run_out_into_an_error(tiny: LLM, jump_forward: bool) -> None:
    engine = tiny.engine
    before = engine.stats()
    streamed, out = _stream(engine, f"imp-{jump_forward}", [104, 105, 10],
                            _params(IMPOSSIBLE, jump_forward=jump_forward))
    after = engine.stats()
    assert out.finish_reason == "error" and out.error_kind is ErrorKind.CONSTRAINT_DEAD_END
    assert out.error is not None and "value check failed" in out.error
    assert "repeats an earlier item" in out.error
    assert 1 <= after.check_retries - before.check_retries <= 5
    assert after.check_failures - before.check_failures == 1
    # NOTE: the text of an error stops before what was held back (the failed value)
    assert _text_of(tiny, out).startswith(out.text) and streamed == out.text
    assert out.text.count('"a"') == 1  # the repeats never showed
    _pool_is_whole(engine)


@pytest.mark.parametrize("schema", [PAIR, NOT], ids=["unique", "not"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_replies_validate_and_the_stream_matches(tiny: LLM, schema: dict[str, Any],
                                                 seed: int) -> None:
    engine = tiny.engine
    streamed, out = _stream(engine, f"ok-{seed}-{len(schema)}", [104, 105, 10 + seed],
                            _params(schema, temperature=1.0, seed=seed))
    assert out.finish_reason in ("stop", "error", "length"), out.error
    if out.finish_reason == "stop":
        jsonschema.validate(json.loads(out.text), schema)
    else:
        assert out.finish_reason == "length" or "value check failed" in (out.error or "")
    assert len(out.logprobs) == len(out.token_ids)
    if out.finish_reason == "error":
        assert _text_of(tiny, out).startswith(out.text) and streamed == out.text
    else:
        assert out.text == _text_of(tiny, out) == streamed
    _pool_is_whole(engine)


def test_batched_requests_with_retries_match_alone(tiny: LLM) -> None:
    """Rolled-back requests beside others in one batch: the same greedy replies as alone
    (the KV of the positions taken back is recomputed, never read stale)."""
    prompts = [[104, 105, 10 + i] for i in range(4)]
    plist = [_params(s) for s in (IMPOSSIBLE, PAIR, NOT, PAIR)]
    together = tiny.generate(prompts, plist)
    alone = [tiny.generate([p], [sp])[0] for p, sp in zip(prompts, plist)]
    for a, b in zip(together, alone):
        assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason)
    _pool_is_whole(tiny.engine)
