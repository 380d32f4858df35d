"""Every JSON result line a benchmark prints says which checkout (``git describe --dirty``), which
CPU and when (benchmarks/machine.py ``stamp()``): read from the scripts' source, not by running
them (they are long). A result line is a ``print(json.dumps(x))`` to stdout; ``x`` must be a dict
starting with ``**stamp()``, or name all three (``git``/``revision``, ``cpu``, ``time``/``started``),
directly or in the dict the printed variable was built from in the same function."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
from machine import stamp

SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "__main__" in p.read_text())
FIELDS = ({"git", "revision"}, {"cpu"}, {"time", "started"})


def _is_stamp(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "stamp")


def _stamped(d: ast.Dict) -> bool:
    if any(k is None and _is_stamp(v) for k, v in zip(d.keys, d.values)):
        return True
    keys = {k.value for k in d.keys if isinstance(k, ast.Constant)}
    return all(keys & names for names in FIELDS)


def _result_lines(tree: ast.Module) -> list[tuple[ast.Call, ast.AST]]:
    """``(print call, the function or module around it)`` of each JSON line printed to stdout."""
    found = []
    for scope in [tree, *ast.walk(tree)]:
        if not isinstance(scope, (ast.Module, ast.FunctionDef)):
            continue
        for node in ast.walk(scope):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "print" and len(node.args) == 1
                    and isinstance(arg := node.args[0], ast.Call)
                    and isinstance(arg.func, ast.Attribute) and arg.func.attr == "dumps"
                    and not any(k.arg == "file" for k in node.keywords)):
                found.append((node, scope))
    innermost: dict[int, tuple[ast.Call, ast.AST]] = {}
    for call, scope in found:  # ast.walk meets the module first, then inner functions
        innermost[id(call)] = (call, scope)
    return list(innermost.values())


def _ok(call: ast.Call, scope: ast.AST) -> bool:
    value = call.args[0].args[0]  # type: ignore[attr-defined]
    if isinstance(value, ast.Dict):
        return _stamped(value)
    if not isinstance(value, ast.Name):
        return False
    for node in ast.walk(scope):
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if (isinstance(target, ast.Name) and target.id == value.id
                and isinstance(node.value, ast.Dict) and _stamped(node.value)):  # type: ignore
            return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == value.id and node.args and _is_stamp(node.args[0])):
            return True
    return False


@pytest.mark.parametrize("script", SCRIPTS)
def test_result_lines_record_revision_cpu_and_time(script: str) -> None:
    tree = ast.parse((BENCH / script).read_text())
    unstamped = [call.lineno for call, scope in _result_lines(tree) if not _ok(call, scope)]
    assert not unstamped, f"{script}: JSON result lines without stamp() at lines {unstamped}"


def test_the_audit_finds_the_result_lines() -> None:
    lines = {s: len(_result_lines(ast.parse((BENCH / s).read_text()))) for s in SCRIPTS}
    assert lines["bench_router.py"] == 2 and lines["bench_decode.py"] == 1
    bad = ast.parse('def main():\n    out = {"bench": "x"}\n    print(json.dumps(out))\n')
    assert [_ok(c, s) for c, s in _result_lines(bad)] == [False]


def test_stamp_names_the_revision_cpu_and_time() -> None:
    s = stamp()
    assert set(s) == {"git", "cpu", "time"} and all(s.values())
    assert "cores" in s["cpu"] and s["time"][:2] == "20"
