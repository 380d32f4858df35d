"""The checks of an :class:`~grammarserve.config.EngineConfig`'s fields (its ``__post_init__``).

A field typed ``Literal[...]`` is checked against that type's values, so the allowed values
have one source: the field's annotation. Each refusal is an :class:`InvalidRequestError`
naming the field as its ``param``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any, Literal

from grammarserve.errors import InvalidRequestError

#: The dtype names a config may give (``"auto"`` besides, where the field allows it).
DTYPE_NAMES = ("float32", "bfloat16", "float16")
_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")
_POSITIVE = ("kv_cache_tokens", "max_num_reqs", "max_batch_tokens", "grammar_max_depth")
_NON_NEGATIVE = ("kv_host_tier_bytes", "kv_disk_tier_bytes", "grammar_disk_cache_bytes",
                 "grammar_check_retries", "loop_guard", "grammar_max_whitespace",
                 "step_time_target_s")


def _alternatives(values: tuple[Any, ...]) -> str:
    names = [str(v) for v in values]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_fields(config: Any) -> None:
    """Raise :class:`InvalidRequestError` for the first field of ``config`` (a dataclass
    instance) out of its domain."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        if typing.get_origin(hints[f.name]) is Literal:
            allowed = typing.get_args(hints[f.name])
            value = getattr(config, f.name)
            if value not in allowed:
                raise InvalidRequestError(f"{f.name} must be {_alternatives(allowed)}, "
                                          f"got {value!r}", param=f.name)
    for name in ("dtype", "kv_dtype", "kv_tier_dtype"):
        value = getattr(config, name)
        if value is not None and value not in DTYPE_NAMES and value != "auto":
            raise InvalidRequestError(f"{name} must be auto or one of {', '.join(DTYPE_NAMES)}"
                                      f", got {value!r}", param=name)
    for name in _POSITIVE:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise InvalidRequestError(f"{name} must be >= 1", param=name)
    for name in _NON_NEGATIVE:
        value = getattr(config, name)
        if value is not None and value < 0:
            raise InvalidRequestError(f"{name} must be >= 0", param=name)
    if not math.isfinite(config.step_time_target_s):  # NaN passes every comparison above
        raise InvalidRequestError("step_time_target_s must be a finite number of seconds",
                                  param="step_time_target_s")
    if config.kv_memory_fraction is not None and not 0.0 < config.kv_memory_fraction <= 0.95:
        raise InvalidRequestError("kv_memory_fraction must be in (0, 0.95]",
                                  param="kv_memory_fraction")
    if not 0 <= config.num_speculative_tokens <= 31:
        raise InvalidRequestError("num_speculative_tokens must be in [0, 31]",
                                  param="num_speculative_tokens")
    if config.device not in ("auto", "cpu") and not _CUDA_DEVICE.fullmatch(config.device):
        raise InvalidRequestError(f"device must be auto, cpu or cuda[:N], got "
                                  f"{config.device!r}", param="device")
