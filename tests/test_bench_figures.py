"""The benchmarks' headline figures (success among all requests) and the extraction prompt styles."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
import extraction_workload as wl
from figures import success_figures


def test_success_is_counted_among_all_requests() -> None:
    # 32 requests: 1 error, 6 cut by max_tokens, 24 valid of the 25 that finished.
    f = success_figures(32, valid=24, finished=25, cut=6, wall_s=40.0)
    assert f == {"success_pct": 75.0, "goodput_valid_per_s": 0.6, "valid_of_finished_pct": 96.0,
                 "cut_by_length": 6, "valid_replies": 24}
    assert success_figures(0, 0, 0, 0, None)["success_pct"] is None


@pytest.mark.parametrize("style", wl.FEW_SHOT_STYLES)
def test_few_shot_styles(style: str) -> None:
    text = wl.instructions(6, style)
    answers = re.findall(r"\nJSON: (\{.*?\})\n", text, flags=re.DOTALL)
    if style == "none":
        assert answers == [] and "Example" not in text
        return
    assert len(answers) == 6
    for a in answers:
        json.loads(a)
        assert a == wl.dump_answer(json.loads(a), style)
    # spaced is the default and the json.dumps default (issue 15's workload)
    assert (wl.instructions() == text) == (style == "spaced")


def test_table_derives_success_for_old_lines(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("peers_table", BENCH / "peers" / "table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    old = {"server": "grammarserve", "workload": "tools", "requests": 32, "completed": 32,
           "wall_s": 73.89, "valid_pct": 100.0, "cut_by_length": 24, "errors": 0}
    r = table.with_success(old)
    assert (r["success_pct"], r["valid_replies"], r["goodput_valid_per_s"]) == (25.0, 8, 0.1083)
    assert table.with_success({"workload": "chat", "valid_pct": 100.0}).get("success_pct") is None


def test_readme_headline_table_is_rendered_from_committed_raw_lines() -> None:
    """README's headline block is exactly what ``benchmarks/headline.py`` renders from the raw
    lines its caption names (no figure typed by hand). Whether HEAD's code is the code they
    measured is ``headline.py --strict``'s check at the end of a change, not asserted here
    (the next code change would turn it red before anyone could measure)."""
    import headline

    readme = (BENCH.parent / "README.md").read_text()
    assert headline.BEGIN in readme and headline.END in readme
    block = readme.split(headline.BEGIN, 1)[1].split(headline.END, 1)[0]
    m = re.search(r"headline\.py --prefix (\S+)`", block)
    assert m is not None, "the caption names its --prefix"
    rendered, _ = headline.render((BENCH.parent / m.group(1)).resolve())
    assert headline.BEGIN + block + headline.END == rendered
