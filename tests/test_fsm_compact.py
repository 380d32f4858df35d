"""Compact JSON (``json_style="compact"``): fixed separators on both backends, so keys and
punctuation are forced and jump-forward can skip them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from walk_helpers import walk_jump_forward

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk

pytestmark = pytest.mark.model  # every test here uses the embedded model


SCHEMAS = sorted((Path(__file__).resolve().parents[1] / "schemas").glob("*.json"))
EOS = 2


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def compiler(request: pytest.FixtureRequest, tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, backend=request.param, json_style="compact",
                           open_schemas=True)


def _items() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in SCHEMAS]


def test_compact_instances_accepted_and_spaced_ones_refused(compiler: GrammarCompiler,
                                                            tokenizer: Any) -> None:
    bitmask = compiler.allocate_bitmask(1)
    compiled = 0
    for item in _items():
        try:
            grammar = compiler.compile_json_schema(item["schema"])
        except GrammarError:  # a backend refusing a schema is covered elsewhere
            continue
        compiled += 1
        for inst in item["valid"]:
            text = json.dumps(inst, separators=(",", ":"), ensure_ascii=False)
            ids = tokenizer.encode(text, add_special_tokens=False)
            ok, why = walk(grammar.matcher(), ids, EOS, bitmask)
            assert ok, (item["name"], text, why)
            if isinstance(inst, (dict, list)) and len(inst) > 0:
                spaced = json.dumps(inst, ensure_ascii=False)
                if spaced != text:
                    ids = tokenizer.encode(spaced, add_special_tokens=False)
                    assert not walk(grammar.matcher(), ids, EOS, bitmask)[0], item["name"]
    assert compiled >= 36  # xgrammar alone: 38 of schemas/ (benchmarks/upgrade_coverage.py)


def test_compact_jump_forward_forces_keys(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer, backend="llguidance", json_style="compact",
                               open_schemas=True)
    token_bytes = [tokenizer.decode([t]).encode() for t in range(len(tokenizer))]
    bitmask = compiler.allocate_bitmask(1)
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "status": {"enum": ["active", "inactive"]}},
              "required": ["name", "status"], "additionalProperties": False}
    text = json.dumps({"name": "Ann", "status": "inactive"}, separators=(",", ":"))
    ok, why, forced = walk_jump_forward(compiler.compile_json_schema(schema).matcher(), text,
                                        tokenizer, bitmask, EOS, token_bytes)
    assert ok, why
    n = len(tokenizer.encode(text, add_special_tokens=False))
    assert forced >= n // 2, (forced, n)
