"""Cache folders that someone else can write (``grammarserve/disk_store.py`` under the grammar
cache and the KV disk tier, authenticated with ``grammarserve/cache_secret.py``): a FIFO, a
link, a folder or an oversize file in an entry's place is a miss that returns at once; an
entry re-signed with a bare checksum or another secret, or another key's entry moved in its
place, is a miss; a good entry hits in another store with the same secret; the secret is
made once, 0600, by one of many processes starting at once; and a compiler whose stored spec
of one schema was forged with another schema's serves the schema it was asked for."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from grammarserve import cache_secret
from grammarserve.attention.kv_pool import KVPool
from grammarserve.cache_secret import ENV, SECRET_BYTES, load_secret
from grammarserve.disk_store import FORMAT, DiskStore, entry_mac
from grammarserve.engine.kv_tiers.blocks import BlockLayout, gather
from grammarserve.engine.kv_tiers.disk import DiskTier
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk
from grammarserve.fsm.disk_cache import DiskCache

S1 = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": False}
S2 = {"type": "object", "properties": {"zzz": {"type": "boolean"}, "note": {"type": "string"}},
      "required": ["zzz", "note"], "additionalProperties": False}
FORGED = {"zzz": False, "note": "forged"}


@pytest.fixture(autouse=True)
def secret_file(tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's secret, outside its folders (never the user's own)."""
    path = tmp_path_factory.mktemp("config") / "cache-secret"
    monkeypatch.setenv(ENV, str(path))
    return path


def _promptly(fn: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """``fn()`` run on a thread (what it returns or raises); fails instead of hanging the suite
    if it blocks."""
    box: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            box.append((fn(), None))
        except BaseException as e:  # noqa: BLE001 -- raised again on the caller's thread
            box.append((None, e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the read blocked for {timeout_s} s"
    value, error = box[0]
    if error is not None:
        raise error
    return value


class _Grammar:
    """The grammar cache's folder, through the same calls the compiler makes."""

    def __init__(self, folder: Path) -> None:
        self.store = DiskCache(folder, 1 << 20)
        self.folder = folder
        self.namespace = "spec"

    def put(self, key: str, payload: bytes) -> None:
        assert self.store.put(self.namespace, key, payload)

    def get(self, key: str) -> bytes | None:
        return self.store.get(self.namespace, key)  # type: ignore[no-any-return]


class _KV:
    """The KV disk tier's folder (its blocks as bytes)."""

    def __init__(self, folder: Path) -> None:
        pool = KVPool(capacity=64, num_kv_heads=2, head_dim=4, num_layers=2,
                      dtype=torch.float32)
        g = torch.Generator().manual_seed(0)
        for t in pool.k + pool.v:
            t.copy_(torch.randn(t.shape, generator=g))
        self.layout = BlockLayout.of(pool, None, block_tokens=8)
        self.blocks = gather(pool, torch.arange(1, 33), self.layout)
        self.tier = DiskTier(str(folder), 1 << 24, self.layout)
        self.store = self.tier.store
        self.folder = folder
        self.namespace = "kv"

    def payload(self, i: int) -> bytes:
        return self.blocks[i].contiguous().view(torch.uint8).numpy().tobytes()

    def put(self, key: str, payload: bytes) -> None:
        block = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(
            self.layout.store_dtype).reshape(self.layout.shape)
        assert self.tier.put(key, block) and self.tier.flush(30)

    def get(self, key: str) -> bytes | None:
        block = self.tier.get(key)
        return None if block is None else block.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.fixture(params=["grammar", "kv"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    folder = tmp_path / "cache"
    c = _Grammar(folder) if request.param == "grammar" else _KV(folder)
    yield c
    if isinstance(c, _KV):
        c.tier.close()


def _payloads(cache: Any) -> tuple[bytes, bytes]:
    if isinstance(cache, _KV):
        return cache.payload(0), cache.payload(1)
    return b'{"schema": "one"}', b'{"zzz": false, "note": "forged"}'


def _entry(cache: Any, key: str, payload: bytes) -> Path:
    """Write ``key``'s entry; its file."""
    before = set(cache.folder.glob("*.gsc"))
    cache.put(key, payload)
    (path,) = set(cache.folder.glob("*.gsc")) - before
    return path  # type: ignore[no-any-return]


def test_a_fifo_in_an_entry_place_is_a_prompt_miss(cache: Any) -> None:
    good, _ = _payloads(cache)
    path = _entry(cache, "k", good)
    path.unlink()
    os.mkfifo(path)
    assert not cache.store.contains(cache.namespace, "k")
    assert _promptly(lambda: cache.get("k")) is None
    s = cache.store.stats()
    assert (s.corrupt, s.misses) == (1, 1)
    assert not path.exists()  # removed: the next write is read back
    cache.put("k", good)
    assert _promptly(lambda: cache.get("k")) == good


def test_a_link_in_an_entry_place_is_a_miss(cache: Any, tmp_path: Path) -> None:
    good, _ = _payloads(cache)
    path = _entry(cache, "k", good)
    outside = tmp_path / "outside.gsc"
    outside.write_bytes(path.read_bytes())  # NOTE: a valid entry of this very key
    path.unlink()
    path.symlink_to(outside)
    assert _promptly(lambda: cache.get("k")) is None
    assert cache.store.stats().corrupt == 1
    assert not path.is_symlink() and outside.read_bytes().endswith(good)  # the target is kept
    cache.put("k", good)  # NOTE: replaces the link, never writes through it
    assert not path.is_symlink() and cache.get("k") == good


def test_an_oversize_file_is_a_miss_without_being_read(cache: Any) -> None:
    good, _ = _payloads(cache)
    path = _entry(cache, "k", good)
    with open(path, "r+b") as f:
        f.truncate(64 << 30)  # NOTE: sparse; read whole it would take minutes and 64 GiB
    assert _promptly(lambda: cache.get("k")) is None
    assert cache.store.stats().corrupt == 1 and not path.exists()


def test_a_folder_in_an_entry_place_is_a_miss_and_the_store_keeps_writing(cache: Any) -> None:
    good, other = _payloads(cache)
    path = _entry(cache, "k", good)
    path.unlink()
    path.mkdir()
    assert _promptly(lambda: cache.get("k")) is None
    assert not cache.store.put(cache.namespace, "k", good)  # that entry only is not written
    cache.put("k2", other)
    assert cache.get("k2") == other


def _header(path: Path) -> tuple[dict[str, Any], bytes]:
    head, payload = path.read_bytes().split(b"\n", 1)
    return json.loads(head), payload


def _write(path: Path, header: dict[str, Any], payload: bytes) -> None:
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)


@pytest.mark.parametrize("forgery", ["bare_sha256", "sha256_as_hmac", "other_secret",
                                     "format_2"])
def test_an_entry_signed_without_the_secret_is_a_miss(cache: Any, forgery: str) -> None:
    good, other = _payloads(cache)
    path = _entry(cache, "k", good)
    header, _ = _header(path)
    sha = hashlib.sha256(other).hexdigest()
    if forgery == "bare_sha256":
        header.pop("hmac")
        header.update(bytes=len(other), sha256=sha)
    elif forgery == "sha256_as_hmac":
        header.update(bytes=len(other), hmac=sha)
    elif forgery == "other_secret":
        header.update(bytes=len(other),
                      hmac=entry_mac(b"\x01" * SECRET_BYTES, cache.namespace, header["key"], other))
    else:  # the layout before entries were authenticated
        header = {"format": 2, "namespace": cache.namespace, "key_sha256": header["key"],
                  "bytes": len(other), "sha256": sha}
    _write(path, header, other)
    assert cache.get("k") is None
    assert cache.store.stats().corrupt == 1 and not path.exists()


def test_another_keys_entry_in_this_place_is_a_miss(cache: Any) -> None:
    good, other = _payloads(cache)
    path = _entry(cache, "k", good)
    other_path = _entry(cache, "k2", other)
    path.write_bytes(other_path.read_bytes())  # NOTE: moved whole, validly signed
    assert cache.get("k") is None
    assert cache.get("k2") == other
    # the payload swapped in under this key's header, the header recomputed with a guess
    header, _ = _header(other_path)
    mine = _entry(cache, "k", good)
    mine_header, _ = _header(mine)
    for guess in (b"", b"\x00" * SECRET_BYTES):
        _write(mine, {**mine_header, "bytes": len(other),
                      "hmac": entry_mac(guess, cache.namespace, mine_header["key"], other)},
               other)
        assert cache.get("k") is None
    assert header["key"] != mine_header["key"]
    assert cache.store.stats().corrupt == 3


def test_a_good_entry_hits_in_every_store_with_the_same_secret(tmp_path: Path,
                                                               secret_file: Path) -> None:
    folder = tmp_path / "cache"
    first = DiskStore(folder, 1 << 20, namespaces=("spec",), label="first")
    assert first.put("spec", "k", b"payload")
    second = DiskStore(folder, 1 << 20, namespaces=("spec",), label="second")
    assert second.get("spec", "k") == b"payload" and second.contains("spec", "k")
    assert DiskCache(folder, 1 << 20).get("spec", "k") == b"payload"
    other_secret = tmp_path / "other-secret"
    stranger = DiskStore(folder, 1 << 20, namespaces=("spec",), label="stranger",
                         secret_file=other_secret)
    assert stranger.get("spec", "k") is None  # another installation: a miss
    assert stranger.put("spec", "k", b"theirs")
    assert second.get("spec", "k") == b"payload"  # NOTE: keyed names: no clash either
    assert len(list(folder.glob("*.gsc"))) == 2
    header, _ = _header(next(folder.glob("*.gsc")))
    assert header["format"] == FORMAT and "sha256" not in header
    assert load_secret(secret_file) != load_secret(other_secret)


def test_the_secret_is_made_once_and_private(tmp_path: Path, secret_file: Path) -> None:
    """Processes (and threads) that start at once on a missing secret all read one secret."""
    target = tmp_path / "cfg" / "grammarserve" / "cache-secret"
    # NOTE: the module alone (stdlib only): importing the package would take seconds each
    code = ("import importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('cache_secret', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(m.load_secret(sys.argv[2]).hex())")
    procs = [subprocess.Popen([sys.executable, "-c", code, cache_secret.__file__, str(target)],
                              stdout=subprocess.PIPE, text=True) for _ in range(6)]
    barrier = threading.Barrier(6)

    def racer() -> str:
        barrier.wait(30)
        return load_secret(target).hex()

    threads = [threading.Thread(target=lambda: seen.add(racer())) for _ in range(6)]
    seen: set[str] = set()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    seen |= {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert seen == {load_secret(target).hex()} and len(bytes.fromhex(seen.pop())) == SECRET_BYTES
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert [p.name for p in target.parent.iterdir()] == ["cache-secret"]  # no temp files left
    assert not secret_file.exists()  # NOTE: only what was asked for is made


def test_the_default_secret_lives_under_the_config_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    DiskStore(tmp_path / "cache", 1 << 20, namespaces=("spec",), label="t").put("spec", "k", b"")
    secret = tmp_path / "xdg" / "grammarserve" / "cache-secret"
    assert secret.stat().st_size == SECRET_BYTES
    assert not list((tmp_path / "cache").glob("*secret*"))


@pytest.mark.parametrize("problem", ["readable", "link", "short", "fifo"])
def test_an_untrusted_secret_turns_the_store_off(tmp_path: Path, secret_file: Path,
                                                 problem: str) -> None:
    load_secret(secret_file)
    if problem == "readable":
        secret_file.chmod(0o644)
    elif problem == "link":
        real = tmp_path / "real-secret"
        os.replace(secret_file, real)
        secret_file.symlink_to(real)
    elif problem == "short":
        secret_file.write_bytes(b"x")
    else:
        secret_file.unlink()
        os.mkfifo(secret_file, 0o600)
    with pytest.raises(OSError, match="cache secret"):
        _promptly(lambda: load_secret(secret_file))
    store = _promptly(lambda: DiskStore(tmp_path / "cache", 1 << 20, namespaces=("spec",),
                                        label="t"))
    assert not store.put("spec", "k", b"x") and store.get("spec", "k") is None
    assert not (tmp_path / "cache").exists()


@pytest.mark.model
@pytest.mark.parametrize("forgery", ["moved", "resigned"])
def test_a_compiler_serves_the_schema_asked_for_over_a_forged_entry(
        tokenizer: Any, tmp_path: Path, forgery: str) -> None:
    """S1's stored spec replaced by S2's (the whole entry moved, or S2's payload under S1's
    header re-signed without the secret): S1 compiles as S1, from a miss."""
    def compiler(folder: Path) -> GrammarCompiler:
        return GrammarCompiler(tokenizer, background_upgrade=False, disk_cache_dir=str(folder))

    for schema, folder in ((S1, tmp_path / "s1"), (S2, tmp_path / "s2")):
        c = compiler(folder)
        c.compile_json_schema(schema)
        c.flush_disk_writes()
    (s1_file,) = (tmp_path / "s1").glob("spec-*.gsc")
    (s2_file,) = (tmp_path / "s2").glob("spec-*.gsc")
    if forgery == "moved":
        s1_file.write_bytes(s2_file.read_bytes())
    else:
        s1_header, _ = _header(s1_file)
        _, s2_payload = _header(s2_file)
        _write(s1_file, {**s1_header, "bytes": len(s2_payload),
                         "hmac": hashlib.sha256(s2_payload).hexdigest()}, s2_payload)

    again = compiler(tmp_path / "s1")
    grammar = again.compile_json_schema(S1)
    disk = again.cache_stats().disk
    assert disk is not None and (disk.spec_hits, disk.corrupt) == (0, 1)
    bitmask = again.allocate_bitmask(1)
    stop = again.stop_token_ids[0]

    def accepts(instance: Any) -> bool:
        ids = tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        return bool(walk(grammar.matcher(), ids, stop, bitmask)[0])

    assert accepts({"a": 1}) and not accepts(FORGED)
