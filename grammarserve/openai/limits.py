"""Size checks that run before anything costly (rendering, tokenizing, compiling): the prompt's
characters and the engine requests one API request asks for.

# NOTE: the character bound. A prompt of ``T`` tokens decodes to at most ``T x L`` characters,
# ``L`` being the longest token of the vocabulary in characters of its raw form (a byte-level BPE
# token of ``L`` symbols is ``L`` bytes, hence at most ``L`` characters; a SentencePiece piece
# decodes to as many characters as it has). Text longer than ``max_model_len x L`` therefore cannot
# fit the context whatever its tokenization, so refusing it before tokenizing never refuses a
# prompt that fits: the check only makes the answer fast (a 10 MB body tokenized would take tens of
# seconds). A tokenizer with a normalizer may shrink text before tokenizing (NFC composes
# characters), so the bound is then taken 4x wider. For the embedded SmolLM2 (byte-level BPE, no
# normalizer, longest token 81 bytes, context 8192) the bound is 663,552 characters.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from grammarserve.errors import ErrorKind, InvalidRequestError

#: Widening of the bound for tokenizers with a normalizer (see the note above).
_NORMALIZER_FACTOR = 4


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest raw token (special tokens included)."""
    raws = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max((len(r) for r in raws if isinstance(r, str)), default=1)


def prompt_char_bound(tokenizer: Any, max_model_len: int) -> int:
    """Characters no prompt that fits ``max_model_len`` tokens can exceed."""
    per_token = longest_token_chars(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        per_token *= _NORMALIZER_FACTOR
    return max_model_len * per_token


def text_chars(value: Any) -> int:
    """Characters in every string (keys included) of a nested value of dicts, lists and
    pydantic models; iterative, so any depth is fine."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, BaseModel):
            stack.extend(item.__dict__.values())
            stack.extend((item.__pydantic_extra__ or {}).values())
    return total


def prompt_texts(prompt: str | list[str] | list[int] | list[list[int]]
                 ) -> tuple[int, list[str]]:
    """How many prompts a completion request's ``prompt`` holds, and the texts among them."""
    if isinstance(prompt, str):
        return 1, [prompt]
    if not prompt or isinstance(prompt[0], int):
        return 1, []
    return len(prompt), [p for p in prompt if isinstance(p, str)]


def check_prompt_chars(chars: int, limit: int | None, param: str) -> None:
    """Refuse a prompt of ``chars`` characters over ``limit`` (``context_length_exceeded``)."""
    if limit is not None and chars > limit:
        raise InvalidRequestError(
            f"the prompt has {chars} characters; at most {limit} can fit this model's context, "
            f"so it is refused before tokenizing ({param})", param=param,
            kind=ErrorKind.PROMPT_TOO_LONG)


def check_choices(prompts: int, n: int, limit: int | None) -> None:
    """Refuse a request for more than ``limit`` engine requests (``prompts`` x ``n``); the
    error names ``prompt`` when the prompts alone are too many, else ``n``."""
    if limit is None or prompts * n <= limit:
        return
    param = "prompt" if prompts > limit else "n"
    raise InvalidRequestError(
        f"this request asks for {prompts * n} completions ({prompts} prompt(s) x n={n}); "
        f"this server allows at most {limit} per request", param=param)
