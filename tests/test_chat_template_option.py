"""``--chat-template``: a template file (or text) replaces the tokenizer's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from grammarserve.cli import build_parser
from grammarserve.cli_engine import engine_config as _config
from grammarserve.errors import ModelLoadError
from grammarserve.models.loader import load_tokenizer, read_chat_template, resolve_model_folder

TEMPLATES = Path(__file__).parent / "data" / "templates"


def test_a_template_file_replaces_the_models_template() -> None:
    path = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
    tok = load_tokenizer(resolve_model_folder("default", None), str(path))
    assert tok.chat_template == path.read_text(encoding="utf-8")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_template_text_is_taken_as_is() -> None:
    assert read_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"


def test_a_missing_template_file_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot read the chat template"):
        read_chat_template(str(tmp_path / "nope.jinja"))


def test_the_cli_passes_the_template_to_the_engine_config() -> None:
    args = build_parser().parse_args(["serve", "--chat-template", "t.jinja"])
    assert _config(args).chat_template == "t.jinja"
