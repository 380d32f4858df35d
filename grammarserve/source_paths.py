"""Keep a source checkout's root off ``sys.path`` in processes another program starts for us.

In a source checkout (an editable install), the ``grammarserve_kernels`` package is the folder
``kernels/`` at the checkout's root. Wherever that root is on ``sys.path``, ``import kernels``
finds that folder instead of Hugging Face's ``kernels`` package, which transformers imports
(``transformers.integrations.hub_kernels``) when it loads a tokenizer or a model. Our own entry
points never put it there (the ``grammarserve`` console script; the test suite runs with
``PYTHONSAFEPATH``), but Ray does: every worker of a job gets the driver's working directory on
its path. The Ray actors call :func:`drop_source_root` first thing in their constructors.

An installed wheel has no ``kernels/`` folder (the package is installed under its own name), so
there :func:`source_root` is None and nothing is dropped.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: The folder name of ``grammarserve_kernels`` in a source checkout (``pyproject.toml``'s
#: ``package-dir``), which is also the import name it would shadow.
SHADOWING_FOLDER = "kernels"


def source_root() -> Path | None:
    """The checkout root holding ``kernels/`` as ``grammarserve_kernels``, or None when the
    package is installed under its own name (a wheel) or absent."""
    spec = importlib.util.find_spec("grammarserve_kernels")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).resolve().parent
    return folder.parent if folder.name == SHADOWING_FOLDER else None


def drop_source_root(path: list[str]) -> list[str]:
    """Remove from ``path`` (in place; ``sys.path`` in practice) every entry that names the
    checkout root (``""`` names the working directory); returns the entries removed."""
    root = source_root()
    if root is None:
        return []
    dropped = [p for p in path if Path(p or os.curdir).resolve() == root]
    path[:] = [p for p in path if p not in dropped]
    return dropped
