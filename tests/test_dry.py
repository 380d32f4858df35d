"""DRY, the repeat penalty inside string values (engine/dry.py), on a byte tokenizer (token id ==
byte): which token a repeat would extend, how much it costs, what breaks a match, and the
sampler applying it before the constraint's mask."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch

from grammarserve.constraints import Constraint
from grammarserve.engine.dry import DryParams, DryPenalty
from grammarserve.engine.sampler import History, sample
from grammarserve.errors import InvalidRequestError
from grammarserve.sampling_params import SamplingParams

DRY = DryParams(multiplier=0.8, base=1.75, allowed_length=2)


def _ids(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture(scope="module")
def dry(hf_tokenizer: Any) -> DryPenalty:
    return DryPenalty(hf_tokenizer, 256)


def test_the_token_that_would_extend_a_repeat_is_penalized(dry: DryPenalty) -> None:
    # inside '"jay.jay.ja': its last 6 tokens "jay.ja" occurred before, followed by "y"
    bias = dry.bias(_ids('"jay.jay.ja'), DRY)
    assert set(bias) == {ord("y")}
    assert bias[ord("y")] == pytest.approx(-0.8 * 1.75 ** (6 - 2))


def test_outside_strings_nothing_is_penalized(dry: DryPenalty) -> None:
    # a number like the one before (1.00 then 1.0): a penalty would change the value
    assert dry.bias(_ids('{"a": 1.00, "b": 1.0'), DRY) == {}
    assert dry.bias(_ids('"x" jay.jay.ja'), DRY) == {}


def test_repeats_no_longer_than_the_allowed_length_are_free(dry: DryPenalty) -> None:
    assert dry.bias(_ids('"xab-ab'), DryParams(0.8, 1.75, 3)) == {}  # "ab" again: m = 2 < 3
    assert dry.bias(_ids('"xab-ab'), DRY) == {ord("-"): pytest.approx(-0.8)}


def test_json_structure_breaks_matches(dry: DryPenalty) -> None:
    # a value that starts like an earlier one: the quote and the space end the match there
    assert dry.bias(_ids('{"q": "ab", "r": "a'), DRY) == {}
    assert dry.bias(_ids('{"q": "a b c", "r": "a b'), DRY) == {}  # spaces break matches too
    assert dry.bias(_ids('"a"'), DRY) == {}  # the last token is a breaker


def test_the_end_of_a_string_is_never_penalized(dry: DryPenalty) -> None:
    # "INV-25194" after "Invit-25194": the repeat "-25194" was followed by the closing quote
    assert dry.bias(_ids('{"v": "Invit-25194", "n": "INV-25194'), DRY) == {}


def test_off_is_nothing(dry: DryPenalty) -> None:
    assert dry.bias(_ids('"jay.jay.ja'), DryParams(0.0, 1.75, 2)) == {}


def test_the_sampler_takes_the_repeat_away_from_greedy(dry: DryPenalty) -> None:
    logits = torch.zeros(1, 256)
    logits[0, ord("y")] = 2.0  # the repeat is the model's favourite by 2
    logits[0, ord("!")] = 1.0
    out = _ids('"jay.jay.ja')
    hist = [History(out, 0)]
    plain = sample(logits, [SamplingParams(temperature=0, dry_multiplier=0.0)], [None],
                   history=hist, dry=dry)
    guarded = sample(logits, [SamplingParams(temperature=0, dry_multiplier=0.8)], [None],
                     history=hist, dry=dry)
    assert plain.token_ids == [ord("y")] and guarded.token_ids == [ord("!")]


def test_the_mask_still_wins(dry: DryPenalty) -> None:
    logits = torch.zeros(1, 256)
    logits[0, ord("y")] = 2.0
    mask = torch.zeros(1, 8, dtype=torch.int32)
    mask[0, ord("y") // 32] = 1 << (ord("y") % 32)  # only the repeat is allowed
    got = sample(logits, [SamplingParams(temperature=0, dry_multiplier=0.8)], [None], mask,
                 history=[History(_ids('"jay.jay.ja'), 0)], dry=dry)
    assert got.token_ids == [ord("y")]


@pytest.mark.parametrize("field, value", [("dry_multiplier", -1.0), ("dry_multiplier", 101.0),
                                          ("dry_base", 0.5), ("dry_allowed_length", 0)])
def test_bad_settings_are_400s_naming_the_parameter(field: str, value: float) -> None:
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field


@pytest.mark.model
def test_dry_ends_a_loop_inside_a_string_value(llm: Any) -> None:
    """On the embedded model, greedy: a comma-separated tags string that loops until
    max_tokens without DRY closes with it, and the reply is valid."""
    schema = {"type": "object", "properties": {"tags": {"type": "string"}},
              "required": ["tags"]}
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "List many tags for a cooking blog as JSON."}],
        tokenize=False, add_generation_prompt=True)
    outs = {d: llm.generate([prompt], SamplingParams(
        max_tokens=120, temperature=0, dry_multiplier=d,
        constraint=Constraint.json_schema(schema)))[0] for d in (0.0, 0.8)}
    assert outs[0.0].finish_reason == "length"
    assert outs[0.8].finish_reason == "stop", outs[0.8].text
    jsonschema.validate(json.loads(outs[0.8].text), schema)
