"""The wheel holds every package: pyproject's explicit ``packages`` list names each folder of
``grammarserve/`` that has an ``__init__.py`` (a missing one installs fine in editable mode and
breaks a real install)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "grammarserve").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
    assert "grammarserve_kernels" in listed
