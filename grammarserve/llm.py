"""Offline generation API: ``LLM(model="default").generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.request import RequestOutput
from grammarserve.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Runs an :class:`Engine` in-process and generates for a list of prompts at full batch.

    Parameters
    ----------
    model:
        ``"default"``, a Hugging Face folder or a GGUF file.
    config:
        Engine options; keyword arguments override its fields (e.g. ``dtype="bfloat16"``).
    """

    def __init__(self, model: str = "default", *, config: EngineConfig | None = None,
                 **overrides: Any) -> None:
        base = config or EngineConfig()
        self.config = dataclasses.replace(base, model=model, **overrides)
        self.engine = Engine(self.config)
        self._ids = 0

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        """Wrap an existing engine (e.g. one sharing already-loaded weights)."""
        obj = cls.__new__(cls)
        obj.config, obj.engine, obj._ids = engine.config, engine, 0
        return obj

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate one completion per prompt (text or token ids), returned in prompt order."""
        batch = _as_prompt_list(prompts)
        plist = (list(params) if isinstance(params, Sequence)
                 else [params or SamplingParams()] * len(batch))
        if len(plist) != len(batch):
            raise ValueError(f"got {len(batch)} prompts but {len(plist)} SamplingParams")
        ids: list[str] = []
        try:
            for prompt, p in zip(batch, plist):
                rid = f"offline-{self._ids}"
                self._ids += 1
                self.engine.add_request(rid, prompt, p)
                ids.append(rid)
        except Exception:
            for rid in ids:  # one bad prompt refuses the whole call; leave nothing queued
                self.engine.abort(rid)
            while self.engine.has_unfinished():
                self.engine.step()
            raise
        final: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [list(cast(list[int], items))]  # one prompt given as token ids
    return [p if isinstance(p, str) else list(p) for p in items]  # type: ignore[arg-type]
