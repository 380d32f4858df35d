"""OpenAI sampling controls as the fused sample kernel takes them: penalties and logit bias.

A row's logit ``x`` of token ``t`` becomes, before the grammar mask and the temperature::

    x = x / rep if x > 0 else x * rep      where t was seen (prompt or generated), rep != 1
    x = x - count(t) * freq - (count(t) > 0) * pres + bias(t)

``count`` counts ``t`` among the tokens generated so far (OpenAI's frequency and presence
penalties); ``rep`` is vLLM's repetition penalty over prompt and generated tokens. The mask is
applied afterwards, so no bias re-allows a masked token.

The control tensors are dense ``[R, V]`` for the ``R`` rows that use controls only; ``rows``
maps each batch row to its control row (``-1``: the row has none and reads nothing of them).
Both the torch reference (:func:`apply_controls_`) and the Triton kernel read this layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingControls:
    """Penalties and logit bias for some rows of a batch of ``B`` rows over ``V`` tokens.

    Parameters
    ----------
    rows:
        int64 ``[B]``: the control row of each batch row, ``-1`` when it has no controls.
    counts:
        int32 ``[R, V]``: how many times each token was generated so far.
    in_prompt:
        bool ``[R, V]``: the token occurs in the prompt (only the repetition penalty reads it).
    bias:
        fp32 ``[R, V]``: added to the logit (0 = none).
    frequency, presence:
        fp32 ``[R]``: OpenAI's penalties (0 = off).
    repetition:
        fp32 ``[R]``: vLLM's repetition penalty (1 = off, > 0).
    """

    rows: torch.Tensor
    counts: torch.Tensor
    in_prompt: torch.Tensor
    bias: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    repetition: torch.Tensor

    def select(self, batch_rows: torch.Tensor) -> SamplingControls:
        """The controls of a sub-batch (``batch_rows`` of this batch, in that order)."""
        return SamplingControls(self.rows[batch_rows], self.counts, self.in_prompt, self.bias,
                                self.frequency, self.presence, self.repetition)


def check_controls(c: SamplingControls, b: int, v: int, device: torch.device) -> None:
    """Raise ``ValueError`` when ``c`` does not fit a ``[B, V]`` batch on ``device``."""
    r = c.counts.shape[0] if c.counts.dim() == 2 else -1
    want = {"rows": (c.rows, torch.int64, (b,)), "counts": (c.counts, torch.int32, (r, v)),
            "in_prompt": (c.in_prompt, torch.bool, (r, v)),
            "bias": (c.bias, torch.float32, (r, v)),
            "frequency": (c.frequency, torch.float32, (r,)),
            "presence": (c.presence, torch.float32, (r,)),
            "repetition": (c.repetition, torch.float32, (r,))}
    for name, (t, dtype, shape) in want.items():
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ValueError(f"controls.{name} must be {dtype} {list(shape)} (B={b}, R={r}, "
                             f"V={v}), got {t.dtype} {list(t.shape)}")
        if t.device != device:
            raise ValueError(f"controls.{name} must be on the logits' device ({device})")


def apply_controls_(x: torch.Tensor, c: SamplingControls) -> None:
    """Apply penalties and bias to fp32 logits ``x`` ``[B, V]`` in place (see the module doc).

    Rows without controls are left bit-for-bit as they are; the operations and their order
    are those of the Triton kernel.
    """
    batch = (c.rows >= 0).nonzero()[:, 0]
    if not batch.numel():
        return
    idx = c.rows[batch]
    y = x[batch]
    counts = c.counts[idx]
    generated = counts > 0
    seen = c.in_prompt[idx] | generated
    rep = c.repetition[idx, None]
    y = torch.where(seen, torch.where(y > 0, y / rep, y * rep), y)
    y = y - counts.float() * c.frequency[idx, None] - generated.float() * c.presence[idx, None]
    x[batch] = y + c.bias[idx]


def build_controls(b: int, v: int, device: torch.device, *, rows: list[int],
                   generated: list[list[int]], prompts: list[list[int] | None],
                   bias: list[dict[int, float]], frequency: list[float], presence: list[float],
                   repetition: list[float]) -> SamplingControls:
    """Controls for ``rows`` of a batch of ``b`` rows (the other rows have none).

    Parameters
    ----------
    rows:
        The batch rows that use controls (``R`` of them); every list below has one entry per
        such row, in the same order.
    generated:
        The tokens each row generated so far (repeats count).
    prompts:
        Each row's prompt tokens, or None when its repetition penalty is off (not read).
    bias:
        Token id -> bias (ids in ``[0, V)``).
    frequency, presence, repetition:
        The penalties.
    """
    r = len(rows)
    index = torch.full((b,), -1, dtype=torch.int64)
    index[rows] = torch.arange(r)

    def scatter(per_row: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [t for seq in per_row for t in seq]
        where = [j for j, seq in enumerate(per_row) for _ in seq]
        return (torch.tensor(where, dtype=torch.int64, device=device),
                torch.tensor(ids, dtype=torch.int64, device=device))

    counts = torch.zeros(r, v, dtype=torch.int32, device=device)
    where, ids = scatter(generated)
    counts.index_put_((where, ids), torch.ones_like(ids, dtype=torch.int32), accumulate=True)
    in_prompt = torch.zeros(r, v, dtype=torch.bool, device=device)
    where, ids = scatter([p or [] for p in prompts])
    in_prompt[where, ids] = True
    table = torch.zeros(r, v, dtype=torch.float32, device=device)
    where, ids = scatter([list(d) for d in bias])
    table[where, ids] = torch.tensor([x for d in bias for x in d.values()],
                                     dtype=torch.float32, device=device)

    def floats(xs: list[float]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.float32, device=device)

    return SamplingControls(index.to(device), counts, in_prompt, table, floats(frequency),
                            floats(presence), floats(repetition))
