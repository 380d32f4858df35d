"""The persistent grammar cache (``grammarserve/fsm/disk_cache.py`` over ``disk_store.py``): a restarted compiler serves
a schema's first request from its stored spec and llguidance, reads its upgraded grammar from
disk on reuse, and walks instances exactly as the upgraded one did; bad entries are misses that
get rewritten; the folder stays in its bound; concurrent writers leave
one valid entry; off writes nothing; and a real server restart serves from disk (``/metrics``)."""

from __future__ import annotations

import json
import multiprocessing
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from server_helpers import http_get, http_post, running_server
from waiting import wait_until

from grammarserve.cache_secret import ENV, load_secret
from grammarserve.cli import build_parser
from grammarserve.cli_engine import engine_config as _config
from grammarserve.config import EngineConfig, grammar_disk_cache_dir
from grammarserve.disk_store import entry_mac
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.backends.xgrammar_backend import MAX_SERIALIZED_BYTES
from grammarserve.fsm.config import GrammarConfig
from grammarserve.fsm.conformance import walk
from grammarserve.fsm.disk_cache import DiskCache, spec_from_json, spec_to_json
from grammarserve.fsm.frontend import SpecBuilder
from grammarserve.fsm.schema.exact_numbers import unit_exclusive_range, unit_exclusive_range_text

ROOT = Path(__file__).resolve().parent.parent
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "enum": ["Ada", "Bob"]},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}
VALID = [{"name": "Ada", "age": 36}, {"name": "Bob", "age": 0, "tags": ["a", "b"]}]
INVALID = [{"name": "Eve", "age": 1}, {"name": "Ada", "age": -1}, {"name": "Ada"},
           {"name": "Bob", "age": 3, "tags": ["a", "b", "a", "b"]}]


@pytest.fixture(autouse=True)
def cache_secret_file(tmp_path_factory: pytest.TempPathFactory,
                      monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own cache secret (never the user's), shared with the processes and servers
    it starts."""
    path = tmp_path_factory.mktemp("config") / "cache-secret"
    monkeypatch.setenv(ENV, str(path))
    return path


def _compiler(tokenizer: Any, folder: Path | None, style: str = "flexible") -> GrammarCompiler:
    return GrammarCompiler(tokenizer, json_style=style, upgrade_niceness=0,
                           disk_cache_dir=None if folder is None else str(folder))


def _upgraded(compiler: GrammarCompiler, schema: Any) -> Any:
    """``schema``'s grammar after its background upgrade, with the disk writes done."""
    grammar = compiler.compile_json_schema(schema)
    grammar.matcher()
    grammar.matcher()  # NOTE: the second matcher starts the upgrade
    assert grammar.upgrade_future is not None and grammar.upgrade_future.result(timeout=300)
    compiler.flush_disk_writes()
    return grammar


def _walks(compiler: GrammarCompiler, tokenizer: Any, grammar: Any, style: str) -> list[bool]:
    bitmask = compiler.allocate_bitmask(1)
    out = []
    for instance in VALID + INVALID:
        texts = [json.dumps(instance)] if style != "auto" else [
            json.dumps(instance, separators=(",", ":")), json.dumps(instance)]
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False)
            out.append(walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)[0])
    return out


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.gsc"))


@pytest.mark.model
@pytest.mark.parametrize("style", ["flexible", "auto"])
def test_restarted_compiler_serves_llguidance_first_and_upgrades_from_disk(
        tokenizer: Any, tmp_path: Path, style: str) -> None:
    first = _compiler(tokenizer, tmp_path, style)
    upgraded = _upgraded(first, PERSON)
    assert upgraded.backend == "xgrammar"
    written = first.cache_stats().disk
    assert written is not None
    # one spec, and one grammar per style (auto: compact and spaced)
    assert written.writes == (3 if style == "auto" else 2)
    expected = _walks(first, tokenizer, upgraded, style)
    valid = len(VALID) * (2 if style == "auto" else 1)
    assert expected[:valid] == [True] * valid and not any(expected[valid:])

    second = _compiler(tokenizer, tmp_path, style)
    restored = second.compile_json_schema(PERSON)
    disk = second.cache_stats().disk
    assert disk is not None
    # NOTE: the first request reads only its spec; llguidance compiles as cold
    assert (disk.spec_hits, disk.grammar_hits, disk.misses) == (1, 0, 0)
    assert restored.backend == "llguidance"
    assert type(restored).__name__ == ("StagedGrammar" if style == "auto"
                                       else "CompiledGrammar")
    assert restored.upgrade_future is None
    assert _walks(second, tokenizer, restored, style) == expected  # reused: upgrades now
    assert restored.upgrade_future is not None and restored.upgrade_future.result(timeout=300)
    second.flush_disk_writes()
    disk = second.cache_stats().disk
    assert disk is not None
    # the upgrade read every style's grammar from disk, compiled none and wrote nothing
    assert (disk.spec_hits, disk.grammar_hits, disk.misses, disk.writes, disk.corrupt) == (
        1, 2 if style == "auto" else 1, 0, 0, 0)
    assert restored.backend == "xgrammar"
    assert _walks(second, tokenizer, restored, style) == expected


@pytest.mark.model
@pytest.mark.parametrize("damage", ["truncate", "flip", "version", "payload"])
def test_a_bad_entry_is_a_miss_and_is_rewritten(tokenizer: Any, tmp_path: Path,
                                                damage: str) -> None:
    _upgraded(_compiler(tokenizer, tmp_path), PERSON)
    grammar_file = next(p for p in _entries(tmp_path) if p.name.startswith("grammar-"))
    data = grammar_file.read_bytes()
    header, payload = data.split(b"\n", 1)
    if damage == "truncate":
        grammar_file.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        i = len(header) + 1 + len(payload) // 2
        grammar_file.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    elif damage == "version":
        fields = json.loads(header)
        fields["format"] = 0
        grammar_file.write_bytes(json.dumps(fields).encode() + b"\n" + payload)
    else:  # a verified entry (signed with this installation's secret) xgrammar refuses
        bad = b'{"not": "a grammar"}'
        fields = json.loads(header)
        fields["bytes"] = len(bad)
        fields["hmac"] = entry_mac(load_secret(), "grammar", fields["key"], bad)
        grammar_file.write_bytes(json.dumps(fields).encode() + b"\n" + bad)

    again = _compiler(tokenizer, tmp_path)
    grammar = _upgraded(again, PERSON)  # NOTE: the grammar entry is read on the upgrade only
    disk = again.cache_stats().disk
    assert disk is not None and (disk.corrupt, disk.grammar_hits, disk.spec_hits) == (1, 0, 1)
    assert grammar.backend == "xgrammar"  # compiled as cold, then rewritten
    assert grammar_file.exists() and disk.writes == 1
    third = _compiler(tokenizer, tmp_path)
    assert _upgraded(third, PERSON).backend == "xgrammar"
    disk = third.cache_stats().disk
    assert disk is not None and (disk.corrupt, disk.grammar_hits, disk.writes) == (0, 1, 0)


def test_spec_json_round_trips_checks_and_origin() -> None:
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "additionalProperties": {"type": "array", "items": {"type": "string"},
                                 "uniqueItems": True}}
    spec = SpecBuilder(GrammarConfig()).json_spec(schema)
    assert spec.checks, "the schema should leave value checks"
    back = spec_from_json(spec_to_json(spec))
    assert back == spec and back.origin == schema and back.kind is spec.kind
    assert back.key("f", "auto") == spec.key("f", "auto")
    # NOTE: the request's own schema is not stored again: the reader passes its own
    short = spec_to_json(spec, schema)
    assert len(short) < len(spec_to_json(spec)) and '"origin_given":true' in short
    given = json.loads(json.dumps(schema))
    back = spec_from_json(short, given)
    assert back == spec and back.origin is given
    with pytest.raises(ValueError):
        spec_from_json(short)
    assert '"origin_given"' not in spec_to_json(spec, dict(schema))  # another object


def test_the_exclusive_range_text_test_matches_the_walk() -> None:
    """``unit_exclusive_range_text`` skips the parse only where no key can be an exclusive
    bound; on the corpora and on escaped keys it answers as the walk does."""
    texts = [json.dumps(json.loads(p.read_text())["schema"])
             for p in sorted((ROOT / "schemas").glob("*.json"))
             + sorted((ROOT / "schemas" / "realworld").glob("*.json"))]
    texts += ['{"type":"number","exclusiveMinimum":0,"maximum":0.5}',
              '{"\\u0065xclusiveMinimum":0,"maximum":0.5}',
              '{"properties":{"a":{"exclusiveMaximum":1,"minimum":0.5}}}']
    for text in texts:
        assert unit_exclusive_range_text(text) == unit_exclusive_range(json.loads(text))
    assert unit_exclusive_range_text(texts[-2]) == "$.exclusiveMinimum"


def test_bad_files_never_raise(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, 1 << 20)
    assert disk.put("spec", "k", b"payload")
    (path,) = _entries(tmp_path)
    for junk in (b"", b"\n", b"{}\npayload", b"\xff\xfe\x00garbage", b"[1]\npayload"):
        path.write_bytes(junk)
        assert disk.get("spec", "k") is None
        assert not path.exists()
        assert disk.put("spec", "k", b"payload")
    assert disk.get("spec", "k") == b"payload"
    assert disk.get("spec", "other") is None
    assert disk.get("grammar", "k") is None  # the namespace is part of the key
    s = disk.cache_stats()
    assert (s.spec_hits, s.corrupt, s.misses, s.writes) == (1, 5, 7, 6)


def test_the_folder_stays_within_its_bound(tmp_path: Path) -> None:
    disk = DiskCache(tmp_path, 5000)
    for i in range(12):
        assert disk.put("spec", f"key{i}", bytes([65 + i]) * 1000)
        time.sleep(0.01)  # NOTE: distinct mtimes are the eviction order under test, not a wait
    sizes = sum(p.stat().st_size for p in _entries(tmp_path))
    assert sizes <= 5000
    s = disk.stats()
    assert s.bytes == sizes and s.evictions == 12 - len(_entries(tmp_path))
    assert disk.get("spec", "key11") == b"L" * 1000  # the newest stays
    assert disk.get("spec", "key0") is None
    assert not disk.put("spec", "huge", b"x" * 6000)  # larger than the bound: not written


def _write_many(folder: str, n: int) -> None:
    disk = DiskCache(folder, 1 << 24)
    for _ in range(n):
        disk.put("grammar", "same", b"G" * 100_000)


def test_concurrent_writers_leave_one_valid_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), 20)) for _ in range(2)]
    threads = [threading.Thread(target=_write_many, args=(str(tmp_path), 20)) for _ in range(2)]
    readers_saw: list[bytes | None] = []

    def read() -> None:
        disk = DiskCache(tmp_path, 1 << 24)
        for _ in range(100):
            readers_saw.append(disk.get("grammar", "same"))

    reader = threading.Thread(target=read)
    for w in (*procs, *threads, reader):
        w.start()
    for w in (*threads, reader):
        w.join()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert [p.name for p in tmp_path.iterdir()] == [_entries(tmp_path)[0].name]
    assert DiskCache(tmp_path, 1 << 24).get("grammar", "same") == b"G" * 100_000
    assert all(seen in (None, b"G" * 100_000) for seen in readers_saw)


@pytest.mark.model
def test_off_writes_nothing(tokenizer: Any, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = _compiler(tokenizer, None)
    _upgraded(compiler, PERSON)
    assert compiler.cache_stats().disk is None and compiler.disk is None
    monkeypatch.setenv("GRAMMARSERVE_GRAMMAR_CACHE", "off")
    assert EngineConfig().grammar_options["disk_cache_dir"] is None
    assert EngineConfig(grammar_disk_cache=None).grammar_options["disk_cache_dir"] is None
    monkeypatch.setenv("GRAMMARSERVE_GRAMMAR_CACHE", str(tmp_path / "g"))
    assert grammar_disk_cache_dir("auto") == str(tmp_path / "g")
    monkeypatch.delenv("GRAMMARSERVE_GRAMMAR_CACHE")
    monkeypatch.setenv("GRAMMARSERVE_CACHE", str(tmp_path / "c"))
    assert grammar_disk_cache_dir("auto") == str(tmp_path / "c" / "grammars")
    parse = build_parser().parse_args
    assert _config(parse(["serve", "--no-grammar-disk-cache"])).grammar_disk_cache is None
    assert _config(parse(["serve", "--grammar-disk-cache", "/x"])).grammar_disk_cache == "/x"
    assert _config(parse(["serve"])).grammar_disk_cache == "auto"
    assert list(tmp_path.iterdir()) == []


def _wait_for_metric(url: str, name: str, why: str, timeout_s: float = 300) -> None:
    """Until counter ``name`` is at least 1 (the background upgrade is done), else fail."""
    wait_until(lambda: _metric(url, name) >= 1, timeout_s, why, interval_s=0.2)


def _metric(url: str, name: str) -> float:
    text = http_get(url + "/metrics")[1].decode()
    found = re.search(rf"^{name}(?:_total)? ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


@pytest.mark.model
def test_a_restarted_server_serves_the_schema_from_disk(tmp_path: Path) -> None:
    folder = tmp_path / "grammars"
    body = {"model": "m", "messages": [{"role": "user", "content": "A person as JSON."}],
            "max_tokens": 4, "response_format": {
                "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}
    args = ("--grammar-disk-cache", str(folder), "--kv-cache-tokens", "4096")
    with running_server(tmp_path / "first.log", *args) as server:
        url = server["url"]
        for _ in range(2):  # NOTE: reused: the engine upgrades it and writes the grammar
            status, _ = http_post(url + "/v1/chat/completions", body)
            assert status == 200
        _wait_for_metric(url, "grammarserve_grammar_disk_writes",
                         "the upgraded grammar was never written")
        assert _metric(url, "grammarserve_grammar_disk_hits") == 0
        assert _metric(url, "grammarserve_server_grammar_disk_writes") == 1  # the spec
    with running_server(tmp_path / "second.log", *args) as server:
        url = server["url"]
        status, _ = http_post(url + "/v1/chat/completions", body)
        assert status == 200
        assert _metric(url, "grammarserve_server_grammar_disk_spec_hits") == 1
        assert _metric(url, "grammarserve_grammar_disk_hits") == 0  # llguidance first
        status, _ = http_post(url + "/v1/chat/completions", body)  # reused: upgraded
        assert status == 200
        _wait_for_metric(url, "grammarserve_grammar_disk_hits",
                         "the upgrade never read the stored grammar")
        assert _metric(url, "grammarserve_grammar_disk_hits") == 1
        assert _metric(url, "grammarserve_grammar_disk_writes") == 0
        assert _metric(url, "grammarserve_grammar_disk_corrupt") == 0


@pytest.mark.model
def test_a_grammar_too_large_to_serialize_cheaply_is_not_written(tokenizer: Any,
                                                                 tmp_path: Path) -> None:
    """xgrammar's JSON of an object with many optional properties grows faster than the
    grammar (600 of them: 2.4 MiB in memory, 118 MiB of JSON, ~1.8 GiB of peak memory while
    writing); over ``MAX_SERIALIZED_BYTES`` only the spec is written, and the grammar still
    serves."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)}}
    compiler = _compiler(tokenizer, tmp_path)
    grammar = _upgraded(compiler, schema)
    assert grammar.backend == "xgrammar"
    assert grammar.size_bytes > MAX_SERIALIZED_BYTES
    disk = compiler.cache_stats().disk
    assert disk is not None and disk.writes == 1  # the spec
    ids = tokenizer.encode('{"p5": "x", "p599": "y"}', add_special_tokens=False)
    assert walk(grammar.matcher(), ids, compiler.stop_token_ids[0],
                compiler.allocate_bitmask(1))[0]
