"""Issue 20, the grammar layer's bounds on the embedded model's tokenizer: the schema that grew
the engine by gigabytes is refused in bounded memory (asserted in a child process with a memory
limit, so a regression fails on any machine), refusals are remembered, every backend runs under
explicit limits, and nesting and tool parameters are checked before any parser runs."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from typing import Any
from unittest import mock

import pytest

from grammarserve.errors import GrammarBackendError, GrammarError, SchemaValidationError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.schema import prepare as prepare_module

pytestmark = pytest.mark.model

NODE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}
OOM_SCHEMA = {"$defs": {"a": NODE}, "$ref": "#/$defs/a"}  # issue 20's first finding
OPTIONAL_CYCLE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                  "$defs": {"a": NODE}}

#: The child process's address-space limit, and the growth of its resident memory allowed
#: while it runs the issue's requests (each refused at once), watched while it runs. Before the
#: fix the third request (after the background upgrade to xgrammar) made jump-forward allocate
#: without end (measured: +2 GB within 10 s): the child then exits over the bound in seconds,
#: on any machine.
ADDRESS_SPACE = 4 * 2**30
MAX_GROWTH_MB = 256

_CHILD = r"""
import json, os, sys, threading, time
from transformers import AutoTokenizer
from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.models.loader import resolve_model_folder

tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
cases, max_growth_mb = json.loads(sys.argv[1]), int(sys.argv[2])
compilers = {b: GrammarCompiler(tok, backend=b, upgrade_niceness=0)
             for b in ("auto", "xgrammar", "llguidance")}
for compiler in compilers.values():
    compiler.warmup()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
base, seen = rss(), [0]

def watch():  # the bound, asserted while it runs: a regression fails in seconds
    while True:
        seen[0] = max(seen[0], rss() - base)
        if seen[0] > max_growth_mb:
            print(json.dumps({"over_bound_mb": seen[0]}), flush=True)
            os._exit(3)
        time.sleep(0.05)  # the watchdog's sampling period, not a wait for an event

threading.Thread(target=watch, daemon=True).start()
results = []
for backend, compiler in compilers.items():
    bitmask = compiler.allocate_bitmask(1)
    for kind, arg, strict in cases:
        for request in range(3):  # the third request killed the engine
            try:
                kwargs = {"strict": strict} if kind == "json_schema" else {}
                grammar = compiler.compile_async(kind, arg, **kwargs).result()
            except GrammarError as e:
                results.append([backend, kind, "refused", str(e)])
                continue
            # the engine's path: a matcher per request, the jump-forward span after each token
            matcher = grammar.matcher()
            for _ in range(32):
                matcher.fill_bitmask(bitmask, 0)
                words = bitmask[0].numpy().view("uint32")
                allowed = [w * 32 + b for w, x in enumerate(words) if x for b in range(32)
                           if x >> b & 1]
                if not allowed or not matcher.accept_token(allowed[0]):
                    break
                for token in matcher.forced_tokens():
                    matcher.accept_token(token)
            if grammar.upgrade_future is not None:
                grammar.upgrade_future.result()
            results.append([backend, kind, "compiled", str(matcher.error())])
seen[0] = max(seen[0], rss() - base)
print(json.dumps({"results": results, "growth_mb": seen[0]}))
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_engine_killing_schema_is_refused_in_bounded_memory() -> None:
    """The issue's schema, three times on every backend (strict or not), plus the same cycle
    behind an optional property and the grammars that never end: each refused at once, and the
    process's memory stays within a bound, under an address-space limit."""
    cases = [["json_schema", OOM_SCHEMA, False], ["json_schema", OOM_SCHEMA, True],
             ["json_schema", OPTIONAL_CYCLE, False],
             ["grammar", 'start: "a" start\n', False],
             ["grammar", 'start: "x" | "a" loop\nloop: "b" loop\n', False]]
    # NOTE: the timeout is a last resort (a regression that loops without allocating); the
    # child's watchdog fails one that allocates within seconds, and a healthy run takes seconds.
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases), str(MAX_GROWTH_MB)],
                          check=False, capture_output=True, text=True, timeout=1200,
                          preexec_fn=_limit_memory)
    assert done.returncode == 0, (done.stdout[-500:], done.stderr[-3000:])
    report = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = {(backend, kind, outcome) for backend, kind, outcome, _ in report["results"]}
    assert {o for _, _, o in outcomes} == {"refused"}, report["results"]
    assert len(report["results"]) == 3 * len(cases) * 3
    messages = [m for _, kind, _, m in report["results"] if kind == "json_schema"]
    assert all('$ref at $["$defs"].a.properties.x can never be completed' in m
               for m in messages), messages
    assert report["growth_mb"] < MAX_GROWTH_MB, report


def test_refusals_are_remembered(tokenizer: Any) -> None:
    """The same bad input is refused from memory: the front end's analysis runs once for it,
    a backend's refusal compiles once, and both count as ``refused``."""
    compiler = GrammarCompiler(tokenizer)
    with mock.patch.object(prepare_module, "check_finite",
                           wraps=prepare_module.check_finite) as analysis:
        for _ in range(3):
            with pytest.raises(SchemaValidationError, match="no finite instance"):
                compiler.compile_json_schema(OOM_SCHEMA)
    assert analysis.call_count == 1
    with mock.patch.object(compiler.policy, "compile", wraps=compiler.policy.compile) as backend:
        for _ in range(3):
            with pytest.raises(GrammarError, match="allows no token at its start"):
                compiler.compile_regex("[^\\x00-\\U0010FFFF]")  # an empty language
    assert backend.call_count == 1
    assert compiler.cache_stats().refused == 4


def test_llguidance_runs_under_explicit_limits(tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(8)}}
    small = GrammarCompiler(tokenizer, backend="llguidance",
                            limits=GrammarLimits(max_grammar_size=50))
    with pytest.raises(GrammarBackendError, match="limit for this grammar: 50"):
        small.compile_json_schema(schema)
    GrammarCompiler(tokenizer, backend="llguidance").compile_json_schema(schema)


def test_xgrammar_compiles_only_what_it_can_bound(tokenizer: Any) -> None:
    """A grammar over ``xgrammar_max_bytes`` is llguidance's alone (xgrammar's compile of a
    large enum takes minutes and gigabytes, and cannot be stopped)."""
    enum = {"enum": [f"value-{i:05d}-" + "x" * 90 for i in range(2000)]}  # ~220 KB
    xgr_only = GrammarCompiler(tokenizer, backend="xgrammar")
    with pytest.raises(GrammarBackendError, match="too large for xgrammar"):
        xgr_only.compile_json_schema(enum)
    auto = GrammarCompiler(tokenizer, background_upgrade=False)
    assert auto.compile_json_schema(enum).backend == "llguidance"
    spec = auto._memo_spec("json_schema", (enum,), {})
    assert not auto.policy.backend("xgrammar").accepts(spec)  # no background upgrade either


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("levels", [64, 65, 150, 250, 300, 1000, 5000])
def test_nesting_is_refused_before_any_parser(tokenizer: Any, levels: int) -> None:
    """Schemas, regexes and grammars nested past the limit are a 400 naming it, at any depth
    (no RecursionError); the limit itself compiles."""
    compiler = GrammarCompiler(tokenizer, max_depth=64)
    schema, regex = _nested_schema(levels), "(?:" * levels + "a" + ")" * levels
    text = '{"type": "array", "items": ' * levels + '{"type": "string"}' + "}" * levels
    grammar = "start: " + "(" * levels + '"a"' + ")" * levels + "\n"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": _nested_schema(levels)}}}}]
    if levels <= 64:
        compiler.compile_json_schema(_nested_schema(levels - 1))  # 64 JSON levels
        compiler.compile_regex("(?:" * 60 + "a" + ")" * 60)
        return
    for compile_it, path in [(lambda: compiler.compile_json_schema(schema), "$"),
                             (lambda: compiler.compile_json_schema(text), "$"),
                             (lambda: compiler.compile_regex(regex), "$.regex"),
                             (lambda: compiler.compile_grammar(grammar), "$.grammar"),
                             (lambda: compiler.compile_tool_calls(tools),
                              "$.tools[0].function.parameters")]:
        with pytest.raises(GrammarError) as e:
            compile_it()
        assert "this server accepts at most 64 levels" in str(e.value)
        assert (e.value.path or "").startswith(path)


@pytest.mark.parametrize("params, shown", [({"type": "string"}, "string"),
                                           ({"properties": {"a": {}}}, "None"),
                                           ({"type": ["object", "null"]}, '["object", "null"]')])
def test_tool_parameters_must_be_an_object_schema(tokenizer: Any, params: dict[str, Any],
                                                  shown: str) -> None:
    compiler = GrammarCompiler(tokenizer)
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    with pytest.raises(GrammarError) as e:
        compiler.compile_tool_calls(tools)
    assert str(e.value) == ("Invalid schema for function 'f': schema must be a JSON Schema of "
                            f"'type: \"object\"', got 'type: \"{shown}\"'.")
    assert e.value.path == "$.tools[0].function.parameters"
    for fine in ({}, None, {"type": "object"}):
        compiler.compile_tool_calls([{"type": "function", "function": {
            "name": "f", **({"parameters": fine} if fine is not None else {})}}])
