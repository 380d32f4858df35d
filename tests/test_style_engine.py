"""The JSON style lock and the default closed schemas in the engine, on the embedded model:
replies in the model's own style finish, with jump-forward on and off, and every reply is
valid against the schema as the user gave it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from grammarserve.constraints import Constraint
from grammarserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

#: What Pydantic emits for a 3-field model: no ``additionalProperties``, an unbounded integer.
CITY = {"title": "City", "type": "object", "required": ["name", "country", "population"],
        "properties": {"name": {"title": "Name", "type": "string"},
                       "country": {"title": "Country", "type": "string"},
                       "population": {"title": "Population", "type": "integer"}}}
SHOT = {"name": "Porto", "country": "Portugal", "population": 231800}
PROMPTS = {
    "none": "Invent a city in France. Answer in JSON.",
    "spaced": f"Example: {json.dumps(SHOT)}\nInvent a city in France. Answer in JSON.",
    "compact": (f"Example: {json.dumps(SHOT, separators=(',', ':'))}\n"
                "Invent a city in France. Answer in JSON."),
}


def _prompt(llm: Any, text: str) -> str:
    return str(llm.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True))


@pytest.mark.parametrize("jump_forward", [True, False])
def test_replies_finish_in_the_models_style(llm: Any, jump_forward: bool) -> None:
    prompts = [_prompt(llm, t) for t in PROMPTS.values()]
    params = SamplingParams(max_tokens=200, temperature=0, jump_forward=jump_forward,
                            constraint=Constraint.json_schema(CITY))
    outs = llm.generate(prompts, [params] * len(prompts))
    for style, out in zip(PROMPTS, outs):
        assert out.finish_reason == "stop", (style, out.text)
        value = json.loads(out.text)
        jsonschema.validate(value, CITY)
        assert set(value) <= set(CITY["properties"]), (style, out.text)  # no invented keys
        assert abs(value["population"]) <= 2**53 - 1
    spaced, compact = outs[1].text, outs[2].text
    assert '": ' in spaced, spaced  # the style the prompt showed
    assert '":' in compact and '": ' not in compact, compact
