"""Found by the issue-33 soak (benchmarks/peers/results-2026-12-01-soak.jsonl): an invalid reply
with ``finish_reason: "stop"`` on the corpus schema ``medical_note``, ``"icd10": "S102"`` under
``^[A-Z][0-9]{2}(\\.[0-9A-Z]{1,4})?$``. xgrammar 0.2.9's ``Grammar.from_json_schema`` takes an
optional group whose body ends in a bounded repeat as if its first character were optional too
(``^1(x[0-9]{1,4})?$`` takes ``"12"``; its ``Grammar.from_regex`` does not); llguidance refuses
them. Each string below fails the pattern: the grammar must refuse it, on both backends, or the
backend must refuse the schema (xgrammar's exact subset now does, naming ``pattern``: such
schemas stay with llguidance when reused)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk

pytestmark = pytest.mark.model  # the embedded model's tokenizer

CASES = [("^[A-Z][0-9]{2}(\\.[0-9A-Z]{1,4})?$", ["S102", "S1023"]),
         ("^1(x[0-9]{1,4})?$", ["12", "1234"])]


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_an_optional_group_ending_in_a_bounded_repeat_keeps_its_first_char(
        tokenizer: Any, backend: str) -> None:
    compiler = GrammarCompiler(tokenizer, backend=backend, background_upgrade=False,
                               json_style="compact", compile_threads=1)
    bitmask = compiler.allocate_bitmask(1)
    taken = []
    for pattern, wrong in CASES:
        try:
            grammar = compiler.compile_json_schema({
                "type": "object", "properties": {"v": {"type": "string", "pattern": pattern}},
                "required": ["v"], "additionalProperties": False})
        except GrammarError as e:  # refused by name is exact too
            assert backend == "xgrammar" and "pattern" in str(e), e
            continue
        for text in wrong:
            assert re.search(pattern, text) is None
            ids = list(tokenizer.encode(json.dumps({"v": text}, separators=(",", ":")),
                                        add_special_tokens=False))
            if walk(grammar.matcher(), ids, tokenizer.eos_token_id, bitmask)[0]:
                taken.append((pattern, text))
    assert taken == []
