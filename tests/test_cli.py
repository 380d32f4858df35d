"""The command line: ``python -m grammarserve`` is the ``grammarserve`` script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_python_m_grammarserve_is_the_cli() -> None:
    module = subprocess.run([sys.executable, "-m", "grammarserve", "--help"], cwd=ROOT,
                            capture_output=True, text=True, check=False, timeout=120)
    script = subprocess.run([str(Path(sys.executable).parent / "grammarserve"), "--help"],
                            cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert module.returncode == 0, module.stderr
    assert module.stdout == script.stdout
    assert "serve" in module.stdout and "batch" in module.stdout


def test_python_m_grammarserve_reports_usage_errors() -> None:
    run = subprocess.run([sys.executable, "-m", "grammarserve", "no-such-command"], cwd=ROOT,
                         capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2
    assert "usage: grammarserve" in run.stderr
