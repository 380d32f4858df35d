"""Triton fused mask + temperature + sample kernel (the CUDA path).

One program per row makes one pass over the vocabulary in blocks of ``SAMPLE_BLOCK``: unpack the
bitmask, mask, scale by 1/temperature, keep an online log-sum-exp, the greedy argmax and the
Gumbel-max over block log-sum-exps; then it re-reads the chosen block to pick the token inside it.
Same math and noise counters as :mod:`grammarserve_kernels.sample_ref` (see there for why two
levels). It runs on CPU tensors in the Triton interpreter when ``TRITON_INTERPRET=1`` is set
before ``triton`` is first imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from grammarserve_kernels.noise import MIX_MULTS, MIX_SHIFTS, UNIFORM_SCALE
from grammarserve_kernels.sample_ref import SAMPLE_BLOCK

_S0, _S1, _S2, _S3 = (tl.constexpr(s) for s in MIX_SHIFTS)
_M0, _M1, _M2 = (tl.constexpr(m) for m in MIX_MULTS)
_SCALE = tl.constexpr(UNIFORM_SCALE)


@triton.jit
def _gumbel(key_lo, key_hi, counter):  # type: ignore[no-untyped-def]  # Triton IR values
    # triple32(triple32(counter ^ key_lo) ^ key_hi), as grammarserve_kernels.noise.gumbel
    h = tl.cast(counter, tl.uint32) ^ key_lo
    for r in tl.static_range(2):
        h = (h ^ (h >> _S0)) * tl.full(h.shape, _M0, tl.uint32)
        h = (h ^ (h >> _S1)) * tl.full(h.shape, _M1, tl.uint32)
        h = (h ^ (h >> _S2)) * tl.full(h.shape, _M2, tl.uint32)
        h = h ^ (h >> _S3)
        if r == 0:
            h = h ^ key_hi
    u = ((h >> 9) * 2 + 1).to(tl.float32) * _SCALE
    return -tl.log(-tl.log(u))


@triton.jit
def _load_block(logits_row, mask_row, start, lane, V, t,  # type: ignore[no-untyped-def]
                HAS_MASK: tl.constexpr):
    offs = start + lane
    valid = offs < V
    x = tl.load(logits_row + offs, mask=valid, other=0.0).to(tl.float32)
    if HAS_MASK:
        word = tl.load(mask_row + offs // 32, mask=valid, other=0)
        valid = valid & (((word >> (offs % 32)) & 1) != 0)
    return tl.where(valid, x / t, float("-inf"))


@triton.jit
def _fused_sample_kernel(  # type: ignore[no-untyped-def]
        logits_ptr, stride_logits, mask_ptr, stride_mask, temp_ptr, key_ptr,
        out_ids_ptr, out_logprobs_ptr, V, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    logits_row = logits_ptr + row.to(tl.int64) * stride_logits
    mask_row = mask_ptr + row.to(tl.int64) * stride_mask
    temp = tl.load(temp_ptr + row)
    greedy = temp == 0.0
    t = tl.where(greedy, 1.0, temp)
    key_lo = tl.load(key_ptr + 2 * row).to(tl.uint32)
    key_hi = tl.load(key_ptr + 2 * row + 1).to(tl.uint32)
    lane = tl.arange(0, BLOCK)

    run_max = float("-inf")  # online log-sum-exp of the row: run_max + log(run_sum)
    run_sum = 0.0
    best_val = float("-inf")  # greedy argmax
    best_idx = 0
    best_key = float("-inf")  # Gumbel-max over block log-sum-exps
    best_blk = 0
    for blk in range((V + BLOCK - 1) // BLOCK):
        y = _load_block(logits_row, mask_row, blk * BLOCK, lane, V, t, HAS_MASK)
        blk_max = tl.max(y, 0)
        shift = tl.where(blk_max == float("-inf"), 0.0, blk_max)
        blk_lse = shift + tl.log(tl.sum(tl.exp(y - shift), 0))

        blk_arg = tl.argmax(y, 0, tie_break_left=True)
        better = blk_max > best_val
        best_idx = tl.where(better, blk * BLOCK + blk_arg, best_idx)
        best_val = tl.where(better, blk_max, best_val)

        new_max = tl.maximum(run_max, blk_lse)
        new_shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - new_shift) + tl.exp(blk_lse - new_shift)
        run_max = new_max

        key = blk_lse + _gumbel(key_lo, key_hi, 2 * blk + 1)
        better = key > best_key
        best_blk = tl.where(better, blk, best_blk)
        best_key = tl.where(better, key, best_key)

    row_lse = run_max + tl.log(run_sum)
    start = best_blk * BLOCK
    y = _load_block(logits_row, mask_row, start, lane, V, t, HAS_MASK)
    inside = tl.argmax(y + _gumbel(key_lo, key_hi, 2 * (start + lane)), 0, tie_break_left=True)
    sampled_val = tl.sum(tl.where(lane == inside, y, 0.0), 0)

    tok = tl.where(greedy, best_idx, start + inside)
    val = tl.where(greedy, best_val, sampled_val)
    empty = row_lse == float("-inf")
    tl.store(out_ids_ptr + row, tl.where(empty, -1, tok).to(tl.int64))
    tl.store(out_logprobs_ptr + row, tl.where(empty, float("-inf"), val - row_lse))


def sample_tokens_triton(logits: torch.Tensor, bitmask: torch.Tensor | None,
                         temperature: torch.Tensor,
                         keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton twin of :func:`grammarserve_kernels.sample_ref.sample_tokens_ref`."""
    b, v = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    ids = torch.empty(b, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(b, dtype=torch.float32, device=logits.device)
    if b == 0:
        return ids, logprobs
    mask = bitmask.contiguous() if bitmask is not None else keys  # unread when HAS_MASK is False
    _fused_sample_kernel[(b,)](
        logits, logits.stride(0), mask, mask.stride(0),
        temperature.to(torch.float32).contiguous(), keys.contiguous(), ids, logprobs, v,
        HAS_MASK=bitmask is not None, BLOCK=SAMPLE_BLOCK, num_warps=8)
    return ids, logprobs
