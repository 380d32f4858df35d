"""Triton fused mask + temperature + sample kernel (the CUDA path).

One program per row makes one pass over the vocabulary in blocks of ``SAMPLE_BLOCK``: apply the
penalties and logit bias (:mod:`grammarserve_kernels.controls`), unpack the bitmask, mask, scale
by 1/temperature, keep an online log-sum-exp, the greedy argmax and the
Gumbel-max over block log-sum-exps; then it re-reads the chosen block to pick the token inside it.
Same math and noise counters as :mod:`grammarserve_kernels.sample_ref` (see there for why two
levels). It runs on CPU tensors in the Triton interpreter when ``TRITON_INTERPRET=1`` is set
before ``triton`` is first imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from grammarserve_kernels.controls import SamplingControls
from grammarserve_kernels.noise import MIX_MULTS, MIX_SHIFTS, UNIFORM_SCALE
from grammarserve_kernels.sample_ref import SAMPLE_BLOCK, Sampled, top_entries

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
                ctl_end, counts_row, prompt_row, bias_row, freq, pres, rep,
                HAS_MASK: tl.constexpr, HAS_CONTROLS: tl.constexpr):
    offs = start + lane
    valid = offs < V
    x = tl.load(logits_row + offs, mask=valid, other=0.0).to(tl.float32)
    if HAS_CONTROLS:
        # grammarserve_kernels.controls.apply_controls_, same operations in the same order (a
        # row without controls reads nothing and gets x / 1, x - 0 - 0 + 0: unchanged)
        live = offs < ctl_end  # V, or 0 for a row without controls
        cnt = tl.load(counts_row + offs, mask=live, other=0)
        generated = cnt > 0
        seen = generated | (tl.load(prompt_row + offs, mask=live, other=0) != 0)
        x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
        x = x - cnt.to(tl.float32) * freq - generated.to(tl.float32) * pres
        x = x + tl.load(bias_row + offs, mask=live, other=0.0)
    if HAS_MASK:
        # NOTE: after the bias: a bias never re-allows a masked token
        word = tl.load(mask_row + offs // 32, mask=valid, other=0)
        valid = valid & (((word >> (offs % 32)) & 1) != 0)
    return tl.where(valid, x / t, float("-inf"))


@triton.jit
def _fused_sample_kernel(  # type: ignore[no-untyped-def]
        logits_ptr, stride_logits, mask_ptr, stride_mask, temp_ptr, key_ptr,
        out_ids_ptr, out_logprobs_ptr, V,
        ctl_rows_ptr, counts_ptr, prompt_ptr, bias_ptr, stride_ctl, freq_ptr, pres_ptr, rep_ptr,
        top_rows_ptr, ybuf_ptr, lse_ptr,
        HAS_MASK: tl.constexpr, HAS_CONTROLS: tl.constexpr, HAS_TOP: tl.constexpr,
        BLOCK: tl.constexpr):
    row = tl.program_id(0)
    logits_row = logits_ptr + row.to(tl.int64) * stride_logits
    mask_row = mask_ptr + row.to(tl.int64) * stride_mask
    temp = tl.load(temp_ptr + row)
    greedy = temp == 0.0
    t = tl.where(greedy, 1.0, temp)
    key_lo = tl.load(key_ptr + 2 * row).to(tl.uint32)
    key_hi = tl.load(key_ptr + 2 * row + 1).to(tl.uint32)
    lane = tl.arange(0, BLOCK)

    # The row's controls (grammarserve_kernels.controls): [R, V] tensors with one row stride.
    crow = tl.load(ctl_rows_ptr + row)  # -1: no controls (all -1 when HAS_CONTROLS is off)
    has_ctl = crow >= 0
    ctl_end = tl.where(has_ctl, V, 0)
    ctl_off = tl.maximum(crow, 0).to(tl.int64) * stride_ctl
    counts_row = counts_ptr + ctl_off
    prompt_row = prompt_ptr + ctl_off
    bias_row = bias_ptr + ctl_off
    freq = tl.load(freq_ptr + tl.maximum(crow, 0), mask=has_ctl, other=0.0)
    pres = tl.load(pres_ptr + tl.maximum(crow, 0), mask=has_ctl, other=0.0)
    rep = tl.load(rep_ptr + tl.maximum(crow, 0), mask=has_ctl, other=1.0)
    # Rows that want top log-probabilities keep their processed logits in ybuf [T, V].
    trow = tl.load(top_rows_ptr + row)  # -1: none wanted
    ybuf_row = ybuf_ptr + tl.maximum(trow, 0).to(tl.int64) * V
    top_end = tl.where(trow >= 0, V, 0)

    run_max = float("-inf")  # online log-sum-exp of the row: run_max + log(run_sum)
    run_sum = 0.0
    best_val = float("-inf")  # greedy argmax
    best_idx = 0
    best_key = float("-inf")  # Gumbel-max over block log-sum-exps
    best_blk = 0
    for blk in range((V + BLOCK - 1) // BLOCK):
        y = _load_block(logits_row, mask_row, blk * BLOCK, lane, V, t, ctl_end, counts_row,
                        prompt_row, bias_row, freq, pres, rep, HAS_MASK, HAS_CONTROLS)
        if HAS_TOP:
            offs = blk * BLOCK + lane
            tl.store(ybuf_row + offs, y, mask=offs < top_end)
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
    y = _load_block(logits_row, mask_row, start, lane, V, t, ctl_end, counts_row, prompt_row,
                    bias_row, freq, pres, rep, HAS_MASK, HAS_CONTROLS)
    inside = tl.argmax(y + _gumbel(key_lo, key_hi, 2 * (start + lane)), 0, tie_break_left=True)
    sampled_val = tl.sum(tl.where(lane == inside, y, 0.0), 0)

    tok = tl.where(greedy, best_idx, start + inside)
    val = tl.where(greedy, best_val, sampled_val)
    empty = row_lse == float("-inf")
    tl.store(out_ids_ptr + row, tl.where(empty, -1, tok).to(tl.int64))
    tl.store(out_logprobs_ptr + row, tl.where(empty, float("-inf"), val - row_lse))
    if HAS_TOP:
        tl.store(lse_ptr + row, row_lse)


def sample_tokens_triton(logits: torch.Tensor, bitmask: torch.Tensor | None,
                         temperature: torch.Tensor, keys: torch.Tensor, *,
                         controls: SamplingControls | None = None,
                         num_top: torch.Tensor | None = None) -> Sampled:
    """The Triton twin of :func:`grammarserve_kernels.sample_ref.sample_tokens_ref`.

    Penalties and bias are applied inside the one pass over the vocabulary (the control
    tensors are read beside the logits, for the rows that have controls only). Rows that want
    top log-probabilities also write their processed logits to a ``[T, V]`` buffer in that
    pass; ``torch.topk`` on it gives the top entries.
    """
    b, v = logits.shape
    dev = logits.device
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    ids = torch.empty(b, dtype=torch.int64, device=dev)
    logprobs = torch.empty(b, dtype=torch.float32, device=dev)
    no_top = num_top is None
    if num_top is None:  # NOTE: no nonzero() then: it would synchronise with the device
        num_top = torch.zeros(b, dtype=torch.int64, device=dev)
        top_rows = torch.zeros(0, dtype=torch.int64, device=dev)
    else:
        top_rows = (num_top > 0).nonzero()[:, 0]
    ybuf = torch.empty(top_rows.numel(), v, dtype=torch.float32, device=dev)
    lse = torch.empty(b, dtype=torch.float32, device=dev)
    if b == 0:
        return Sampled(ids, logprobs, *top_entries(ybuf, lse, num_top, top_rows, b))
    mask = bitmask.contiguous() if bitmask is not None else keys  # unread when HAS_MASK is False
    top_index = torch.full((b,), -1, dtype=torch.int64, device=dev)
    top_index[top_rows] = torch.arange(top_rows.numel(), device=dev)
    if controls is None:
        # NOTE: every row reads -1 from the row map; the other tensors are then never read.
        temps = temperature.to(torch.float32)
        ctl: tuple[torch.Tensor, ...] = (torch.full_like(top_index, -1), keys, keys, keys)
        stride_ctl = 0
        scalars: tuple[torch.Tensor, ...] = (temps, temps, temps)
    else:
        counts = controls.counts.contiguous()
        prompt = controls.in_prompt.contiguous().view(torch.uint8)
        bias = controls.bias.contiguous()
        ctl = (controls.rows.contiguous(), counts, prompt, bias)
        stride_ctl = v
        scalars = (controls.frequency.contiguous(), controls.presence.contiguous(),
                   controls.repetition.contiguous())
    _fused_sample_kernel[(b,)](
        logits, logits.stride(0), mask, mask.stride(0),
        temperature.to(torch.float32).contiguous(), keys.contiguous(), ids, logprobs, v,
        *ctl, stride_ctl, *scalars, top_index, ybuf, lse,
        HAS_MASK=bitmask is not None, HAS_CONTROLS=controls is not None,
        HAS_TOP=top_rows.numel() > 0, BLOCK=SAMPLE_BLOCK, num_warps=8)
    if no_top:
        return Sampled(ids, logprobs, torch.full((b, 0), -1, dtype=torch.int64, device=dev),
                       torch.full((b, 0), float("-inf"), device=dev))
    return Sampled(ids, logprobs, *top_entries(ybuf, lse[top_rows], num_top, top_rows, b))
