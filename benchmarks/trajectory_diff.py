"""Where two constrained greedy trajectories of one request part, and why (issue 32).

Runs one quality-matrix request (``--shape``, ``--style``, ``--doc``) greedily under mode A (our
engine with ``--a`` options) and mode B (our engine with ``--b`` options, or a peer's token ids
from ``--peer-url``, asked with vLLM's ``return_tokens_as_token_ids``), finds the first token
where they differ, and explains it at that prefix:

- the model's own distribution there (our runtime, unconstrained, top 10) and the logprob of
  each side's token, with the margin between them;
- whether A's token was forced (jump-forward: logprob exactly 0, alone in its top list) and, if
  so, how the tokenizer writes the same text (``CanonicalSpans``);
- whether B's token, and the model's favourite, are allowed by A's grammar after A's prefix
  (not allowed: A's grammar took it away: the style lock, the closed-schema or number policy).

Prints one JSON line (git revision, CPU, time, the two texts, the divergence and its reading).

    .venv/bin/python benchmarks/trajectory_diff.py --shape array_of_objects --style no_json \\
        --a canonical_spans=False --b grammar_json_style=flexible --b enable_jump_forward=False
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name, revision
from quality_workload import PROMPT_STYLES, SHAPES, messages
from serverproc import request

from grammarserve.constraints import Constraint
from grammarserve.fsm.canonical import CanonicalSpans
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        try:
            out[key] = json.loads(raw.lower() if raw in ("True", "False") else raw)
        except ValueError:  # a bare string, e.g. grammar_json_style=flexible
            out[key] = raw
    return out


def _ours(llm: LLM, prompt: list[int], schema: dict[str, Any],
          max_tokens: int) -> tuple[list[int], list[bool]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, top_logprobs=1,
                            constraint=Constraint.json_schema(schema))
    out = llm.generate([prompt], params)[0]
    forced = [lp == 0.0 and len(top) == 1 for lp, top in zip(out.logprobs, out.top_logprobs)]
    return list(out.token_ids), forced


def _peer(url: str, msgs: list[dict[str, str]], schema: dict[str, Any],
          max_tokens: int) -> list[int]:
    body = {"model": "default", "temperature": 0, "max_tokens": max_tokens, "messages": msgs,
            "logprobs": True, "return_tokens_as_token_ids": True,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}
    status, reply = request("POST", url + "/v1/chat/completions", body, timeout=600)
    if status != 200:
        raise SystemExit(f"peer answered {status}: {reply}")
    content = reply["choices"][0]["logprobs"]["content"]
    return [int(t["token"].split(":", 1)[1]) for t in content]


def _allowed(llm: LLM, schema: dict[str, Any], prefix: list[int], tokens: list[int]) -> list[bool]:
    compiler = llm.engine.grammar.compiler
    matcher = compiler.compile_json_schema(schema).matcher()
    for t in prefix:
        if not matcher.accept_token(t):
            return [False] * len(tokens)
    mask = compiler.allocate_bitmask(1)
    matcher.fill_bitmask(mask, 0)
    words = mask[0].numpy().view("uint32")
    return [bool(words[t // 32] >> (t % 32) & 1) for t in tokens]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="array_of_objects", choices=list(SHAPES))
    ap.add_argument("--style", default="no_json", choices=PROMPT_STYLES)
    ap.add_argument("--doc", type=int, default=0, help="which document of the cell")
    ap.add_argument("--a", action="append", default=[], metavar="FIELD=JSON",
                    help="EngineConfig override of mode A (repeatable)")
    ap.add_argument("--b", action="append", default=[], metavar="FIELD=JSON")
    ap.add_argument("--peer-url", help="mode B is this server (vLLM) instead of --b")
    ap.add_argument("--max-tokens", type=int, default=320)
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    doc, _truth = shape.documents(args.doc + 1)[args.doc]
    msgs = messages(shape, doc, args.style)
    llm_a = LLM("default", **_options(args.a))
    tok = llm_a.tokenizer
    prompt = list(tok.encode(tok.apply_chat_template(msgs, tokenize=False,
                                                     add_generation_prompt=True),
                             add_special_tokens=False))
    a, a_forced = _ours(llm_a, prompt, shape.schema, args.max_tokens)
    if args.peer_url:
        b = _peer(args.peer_url, msgs, shape.schema, args.max_tokens)
    else:
        b, _ = _ours(LLM("default", **_options(args.b)), prompt, shape.schema, args.max_tokens)
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    out: dict[str, Any] = {
        "bench": "trajectory_diff", "git": revision(), "cpu": cpu_name(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "shape": args.shape, "style": args.style, "doc": args.doc, "a": args.a,
        "b": args.peer_url or args.b, "text_a": tok.decode(a), "text_b": tok.decode(b),
        "tokens_a": len(a), "tokens_b": len(b), "first_divergence": n}
    if n is not None:
        model = llm_a.generate([prompt + a[:n]], SamplingParams(max_tokens=1, temperature=0,
                                                                 top_logprobs=10))[0]
        top = {t: lp for t, lp in model.top_logprobs[0]}
        floor = min(top.values())
        pa, pb = top.get(a[n], floor), top.get(b[n], floor)
        fav = model.top_logprobs[0][0][0]
        ok_b, ok_fav = _allowed(llm_a, shape.schema, a[:n], [b[n], fav])
        canon = CanonicalSpans(tok).canonical(a[:n], a[n:n + 8]) if a_forced[n] else None
        out["divergence"] = {
            "context": tok.decode(a[max(0, n - 12):n]), "token_a": tok.decode([a[n]]),
            "token_b": tok.decode([b[n]]), "a_forced": a_forced[n],
            "a_next": [tok.decode([t]) for t in a[n:n + 8]],
            "b_next": [tok.decode([t]) for t in b[n:n + 8]],
            "canonical_of_a_span": [tok.decode([t]) for t in canon] if canon is not None else None,
            "model_top": [(tok.decode([t]), round(lp, 3)) for t, lp in model.top_logprobs[0]],
            "logprob_a": round(pa, 3), "logprob_b": round(pb, 3), "margin_b_minus_a":
            round(pb - pa, 3), "b_allowed_by_a": ok_b, "model_favourite_allowed_by_a": ok_fav}
        out["reading"] = (
            "A forced a span the tokenizer writes otherwise" if a_forced[n] and canon is not None
            and canon[:1] != a[n:n + 1] else
            "A's grammar does not allow B's token (style lock, schema policy, or a tokenization "
            "of a forced key the backend leaves out)" if not ok_b else
            "A's grammar does not allow the model's favourite" if not ok_fav else
            "both allowed: a near tie (numerics) or an earlier forced token" if abs(pb - pa) < 0.5
            else "both allowed: A took the less likely token")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
