"""Loader parity with transformers on tiny Llama/Qwen2/Qwen3/Mistral folders, and ragged
batches on the tiny Llama."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import (  # shared helpers of the loader tests
    ATOL,
    LLAMA3_SCALING,
    VOCAB,
    all_logits,
    build_tiny,
    edit_config,
    hf_logits,
    prompt_ids,
    prompt_text,
    tiny_runner,
    tiny_tokenizer,
)

from grammarserve.engine.model_runner import BatchEntry
from grammarserve.models.loader import load_model

# --------------------------------------------------------------------------------------------
# 1. loader parity with transformers

PARITY_CASES = [
    pytest.param("llama", {}, False, id="llama"),
    pytest.param("llama", {"rope_theta": 500000.0}, True, id="llama-theta-legacy-config"),
    pytest.param("llama", {"rope_scaling": LLAMA3_SCALING}, True, id="llama3-rope-legacy-config"),
    pytest.param("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, True,
                 id="linear-rope-legacy-config"),
    pytest.param("llama", {"rope_theta": 500000.0}, False, id="llama-theta-tf5-config"),
    pytest.param("llama", {"rope_scaling": LLAMA3_SCALING}, False, id="llama3-rope-tf5-config"),
    pytest.param("qwen2", {}, False, id="qwen2-qkv-bias"),
    pytest.param("qwen3", {"head_dim": 32}, False, id="qwen3-qknorm-head_dim32"),
    pytest.param("mistral", {"sliding_window": None}, False, id="mistral"),
    pytest.param("mistral", {"sliding_window": 8}, False, id="mistral-sliding-window-8"),
    pytest.param("llama", {"tie_word_embeddings": True}, False, id="llama-tied-embeddings"),
]


@pytest.mark.parametrize(("family", "overrides", "legacy"), PARITY_CASES)
def test_loader_parity(family: str, overrides: dict[str, Any], legacy: bool, tmp_path: Path,
                       hf_tokenizer: Any) -> None:
    ref = build_tiny(family, overrides, tmp_path / "model", hf_tokenizer, legacy=legacy)
    lm = load_model(str(tmp_path / "model"))

    mc = lm.config
    assert mc.family == family
    assert (mc.vocab_size, mc.hidden_size, mc.num_layers) == (VOCAB, 64, 2)
    assert (mc.num_heads, mc.num_kv_heads) == (4, 2)
    assert mc.head_dim == overrides.get("head_dim", 16)
    assert mc.attention_bias == (family == "qwen2")
    assert mc.qk_norm == (family == "qwen3")
    assert mc.tie_word_embeddings == overrides.get("tie_word_embeddings", False)
    if mc.tie_word_embeddings:
        assert lm.model.lm_head.weight is lm.model.embed_tokens.weight
    assert lm.model.inv_freq.dtype == torch.float32

    text = prompt_text(20, seed=1)
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode())

    ours = all_logits(lm, ids)
    want = hf_logits(ref, ids)
    assert ours.shape == want.shape == (20, VOCAB)
    assert ours.dtype == torch.float32
    assert want.abs().max() > 0.5  # the tolerance below must be meaningful
    diff = (ours - want).abs().max().item()
    assert diff < ATOL, f"max abs logit diff {diff:.3g} vs transformers"


# Hub config.json files carry keys that the transformers config class normalises on load; the
# loader reads config.json itself, so it must apply the same rules.
CONFIG_FILE_CASES = [
    # Qwen2.5 checkpoints ship "sliding_window": 32768 with "use_sliding_window": false.
    pytest.param("qwen2", {}, {"sliding_window": 8, "use_sliding_window": False},
                 id="qwen2-window-disabled"),
    # Same for Qwen3: transformers drops the window when use_sliding_window is false, but
    # config.py only applies that rule to family "qwen2".
    pytest.param("qwen3", {"head_dim": 32}, {"sliding_window": 8, "use_sliding_window": False},
                 id="qwen3-window-disabled"),
    # With use_sliding_window, Qwen2 windows only layers >= max_window_layers (layer_types);
    # config.py / the attention backend window every layer.
]


@pytest.mark.parametrize(("family", "overrides", "edits"), CONFIG_FILE_CASES)
def test_loader_parity_config_file_keys(family: str, overrides: dict[str, Any],
                                        edits: dict[str, Any], tmp_path: Path,
                                        hf_tokenizer: Any) -> None:
    ref = build_tiny(family, overrides, tmp_path / "model", hf_tokenizer)
    if edits:
        edit_config(tmp_path / "model", **edits)
    lm = load_model(str(tmp_path / "model"))
    ids = prompt_ids(20, seed=2)
    diff = (all_logits(lm, ids) - hf_logits(ref, ids)).abs().max().item()
    assert diff < ATOL, f"max abs logit diff {diff:.3g} vs transformers"


def test_load_bf16(tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    lm = load_model(str(tiny_llama[0]), dtype=torch.bfloat16)
    assert lm.model.embed_tokens.weight.dtype == torch.bfloat16
    assert lm.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    assert lm.model.inv_freq.dtype == torch.float32
    assert lm.model.lm_head.weight.dtype == torch.bfloat16


def test_load_bf16_keeps_exact_fp32_rope_frequencies(
        tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    from grammarserve.models.rope import rope_inv_freq

    lm = load_model(str(tiny_llama[0]), dtype=torch.bfloat16)
    mc = lm.config
    want = rope_inv_freq(mc.head_dim, mc.rope_theta, mc.rope_scaling)
    assert torch.equal(lm.model.inv_freq, want)


def test_parity_cases_are_sensitive(tmp_path: Path, hf_tokenizer: Any) -> None:
    """The llama3 scaling and the sliding window must actually change the logits of a 20-token
    prompt, otherwise the parity cases above would not test them."""
    ids = prompt_ids(20, seed=1)
    base = hf_logits(build_tiny("llama", {}, tmp_path / "a", hf_tokenizer), ids)
    scaled = hf_logits(
        build_tiny("llama", {"rope_scaling": LLAMA3_SCALING}, tmp_path / "b", hf_tokenizer), ids)
    assert (base - scaled).abs().max() > 1e-2
    full = hf_logits(build_tiny("mistral", {"sliding_window": None}, tmp_path / "c", hf_tokenizer),
                      ids)
    window = hf_logits(build_tiny("mistral", {"sliding_window": 8}, tmp_path / "d", hf_tokenizer),
                        ids)
    assert (full[:8] - window[:8]).abs().max() < ATOL
    assert (full[8:] - window[8:]).abs().max() > 1e-2


# --------------------------------------------------------------------------------------------
# 2. ragged batches on the tiny Llama


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("tiny_llama") / "model"
    ref = build_tiny("llama", {}, folder, tiny_tokenizer())
    return folder, ref


def test_ragged_batch_matches_single_forwards(tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    folder, ref = tiny_llama
    lm = load_model(str(folder))
    # (table row, prefix already cached, total length): a fresh prefill, a long extend on a cached
    # prefix (own padded group), a short extend and a decode step (shared padded group).
    reqs = [(2, 0, 20), (0, 6, 24), (3, 10, 15), (1, 12, 13)]
    seqs = [prompt_ids(n, seed=10 + i) for i, (_, _, n) in enumerate(reqs)]

    runner = tiny_runner(lm, capacity=200, max_reqs=4)
    # Hand out the pool's slots in a random order so that no request has contiguous slots.
    slots = runner.pool.alloc(sum(n for _, _, n in reqs))
    slots = slots[torch.randperm(slots.numel(), generator=torch.Generator().manual_seed(0))]
    offset = 0
    for row, _, n in reqs:
        runner.req_to_token.write(row, 0, slots[offset:offset + n])
        offset += n

    # First forward: write the cached prefixes (itself a ragged batch of fresh prefills).
    prefix_entries = [BatchEntry(row, 0, seq[:p]) for (row, p, _), seq in zip(reqs, seqs) if p]
    runner.forward(prefix_entries)

    # Second forward: everything else, all four requests in one ragged batch.
    entries = [BatchEntry(row, p, seq[p:]) for (row, p, _), seq in zip(reqs, seqs)]
    batch = runner.build_batch(entries)
    lens = [n - p for _, p, n in reqs]
    ends = torch.tensor(lens).cumsum(0) - 1
    assert batch.logit_rows.tolist() == ends.tolist()
    assert batch.positions.tolist() == [q for _, p, n in reqs for q in range(p, n)]

    batch.logit_rows = torch.arange(sum(lens))
    ragged = runner.model(batch, runner.attn)
    start = 0
    for (row, p, n), seq in zip(reqs, seqs):
        got = ragged[start:start + n - p]
        single = all_logits(lm, seq)[p:]
        want = hf_logits(ref, seq)[p:]
        assert (got - single).abs().max().item() < ATOL, f"request in row {row} != single forward"
        assert (got - want).abs().max().item() < ATOL, f"request in row {row} != transformers"
        start += n - p


def test_prefill_then_decode_steps_match(tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    """Chunked prefill followed by decode steps, one token per forward, equals one prefill."""
    folder, ref = tiny_llama
    lm = load_model(str(folder))
    seq = prompt_ids(18, seed=3)
    runner = tiny_runner(lm, capacity=64, max_reqs=2)
    row = runner.req_to_token.alloc()
    got = []
    pos = 0
    for chunk in (7, 5, 1, 1, 1, 1, 1, 1):
        runner.req_to_token.write(row, pos, runner.pool.alloc(chunk))
        got.append(runner.forward([BatchEntry(row, pos, seq[pos:pos + chunk])])[0])
        pos += chunk
    assert pos == len(seq)
    ends = torch.tensor([7, 5, 1, 1, 1, 1, 1, 1]).cumsum(0) - 1
    want = hf_logits(ref, seq)[ends]
    assert (torch.stack(got) - want).abs().max().item() < ATOL


