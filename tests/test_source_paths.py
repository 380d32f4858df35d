"""The checkout's ``kernels/`` folder never stands in for Hugging Face's ``kernels`` package.

transformers imports that package (``transformers.integrations.hub_kernels``) when it loads a
tokenizer or a model. Where the checkout's root is on ``sys.path``, ``import kernels`` finds our
folder (installed as ``grammarserve_kernels``) instead and every tokenizer load fails. These
tests fail if the suite, a Python it starts, or a Ray-style worker path puts the root there.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import subprocess
import sys
from pathlib import Path

import pytest
from server_helpers import GRAMMARSERVE, ROOT

from grammarserve.source_paths import drop_source_root, source_root

_IMPORT_HUB_KERNELS = ("import transformers.integrations.hub_kernels, kernels; "
                       "print(kernels.__file__)")


def _outside_checkout(module_file: str | None) -> bool:
    """Whether an imported ``kernels`` is not the checkout's folder (the venv may live inside
    the checkout)."""
    return module_file is None or not Path(module_file).resolve().is_relative_to(ROOT / "kernels")


def test_the_suite_imports_hubs_kernels_package_not_the_checkouts_folder() -> None:
    importlib.import_module("transformers.integrations.hub_kernels")
    kernels = importlib.import_module("kernels")
    assert _outside_checkout(kernels.__file__), kernels.__file__
    # a fresh lookup along today's sys.path (a module imported earlier is not looked up again)
    found = importlib.machinery.PathFinder.find_spec("kernels", sys.path)
    assert found is not None and _outside_checkout(found.origin), found


def test_a_python_the_suite_starts_from_the_root_is_not_shadowed() -> None:
    run = subprocess.run([sys.executable, "-c", _IMPORT_HUB_KERNELS], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert _outside_checkout(run.stdout.strip()), run.stdout


def test_servers_start_through_the_console_script() -> None:
    script = Path(GRAMMARSERVE)
    assert script.is_file() and script.parent == Path(sys.executable).parent
    assert script.read_text().startswith("#!")  # a script: sys.path[0] is its bin folder


def test_drop_source_root_removes_the_root_and_the_working_directory_that_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if source_root() is None:
        pytest.skip("grammarserve_kernels is installed under its own name (no kernels/ folder)")
    assert source_root() == ROOT
    monkeypatch.chdir(ROOT)
    path = ["", str(ROOT), "/nowhere", str(ROOT / "tests"), str(ROOT) + "/"]
    dropped = drop_source_root(path)
    assert dropped == ["", str(ROOT), str(ROOT) + "/"]
    assert path == ["/nowhere", str(ROOT / "tests")]


def test_a_ray_style_worker_path_is_repaired_before_transformers_loads() -> None:
    """Ray gives every worker the driver's working directory first on ``sys.path``; the actors'
    constructors drop it (grammarserve/cluster/)."""
    code = ("import sys; from grammarserve.source_paths import drop_source_root; "
            f"sys.path.insert(0, {str(ROOT)!r}); drop_source_root(sys.path); "
            + _IMPORT_HUB_KERNELS)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert _outside_checkout(run.stdout.strip()), run.stdout
