"""Test helper: random batches with OpenAI sampling controls, and a plain-torch reference of what
the controls mean (written from the definitions, one row at a time, independent of kernels/)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from bitmask_helpers import pack_bitmask
from grammarserve_kernels import SamplingControls, build_controls, stream_keys

CONTROLS = ("frequency", "presence", "repetition", "bias", "all")


@dataclass
class Case:
    logits: torch.Tensor  # [B, V]
    allowed: torch.Tensor  # bool [B, V]
    masked: bool  # pass the bitmask to the kernel (else every token is allowed)
    temperature: torch.Tensor  # [B]
    keys: torch.Tensor
    num_top: torch.Tensor  # int64 [B]
    rows: list[int]  # rows with controls
    generated: list[list[int]]  # per row of the batch
    prompt: list[list[int]]
    bias: list[dict[int, float]]
    frequency: list[float]
    presence: list[float]
    repetition: list[float]

    @property
    def bitmask(self) -> torch.Tensor | None:
        return pack_bitmask(self.allowed) if self.masked else None

    def controls(self) -> SamplingControls:
        r = self.rows
        return build_controls(
            self.logits.shape[0], self.logits.shape[1], torch.device("cpu"), rows=r,
            generated=[self.generated[i] for i in r], prompts=[self.prompt[i] for i in r],
            bias=[self.bias[i] for i in r], frequency=[self.frequency[i] for i in r],
            presence=[self.presence[i] for i in r], repetition=[self.repetition[i] for i in r])


def make_case(control: str, *, masked: bool, b: int = 6, v: int = 1500, seed: int = 0,
              dtype: torch.dtype = torch.float32) -> Case:
    """``b`` rows over ``v`` tokens (two kernel blocks); greedy and sampled rows; rows 1 and 4
    have no controls. Each controlled row's generated tokens repeat its two likeliest tokens
    (so the penalties change greedy choices), and its biases ban its likeliest token (-100),
    push a token it may not use (+100 on a masked one) and favour a random one."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, v, generator=g) * 3).to(dtype)
    allowed = torch.ones(b, v, dtype=torch.bool)
    if masked:
        allowed = torch.rand(b, v, generator=g) < 0.3
        allowed[0] = True  # an unconstrained row among constrained ones
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.0, 1.3, 0.0] * b)[:b]
    num_top = torch.tensor([5, 0, 20, 1, 3, 20] * b)[:b]
    rows = [i for i in range(b) if i % 3 != 1]
    on = {c: control in (c, "all") for c in CONTROLS}
    generated: list[list[int]] = []
    prompt: list[list[int]] = []
    bias: list[dict[int, float]] = []
    for i in range(b):
        order = logits[i].float().masked_fill(~allowed[i], float("-inf")).argsort(descending=True)
        best, second = int(order[0]), int(order[1])
        generated.append([best, second, best] + torch.randint(0, v, (20,), generator=g).tolist())
        prompt.append([second] + torch.randint(0, v, (30,), generator=g).tolist())
        row_bias: dict[int, float] = {}
        if on["bias"]:
            row_bias = {best: -100.0, int(torch.randint(0, v, (1,), generator=g)): 7.5}
            if bool((~allowed[i]).any()):
                row_bias[int((~allowed[i]).nonzero()[0, 0])] = 100.0
        bias.append(row_bias)
    return Case(logits, allowed, masked, temperature, stream_keys(range(b), [seed] * b),
                num_top, rows, generated, prompt, bias,
                frequency=[1.5 if on["frequency"] else 0.0] * b,
                presence=[-0.5 if on["presence"] else 0.0] * b,
                repetition=[1.7 if on["repetition"] else 1.0] * b)


def reference_logprobs(case: Case) -> torch.Tensor:
    """fp32 ``[B, V]`` log-probabilities each row samples from, straight from the definitions:
    repetition penalty over prompt + generated tokens (vLLM), then OpenAI's frequency and
    presence penalties over generated tokens and the logit bias, then the grammar mask, then
    temperature (1 for greedy rows)."""
    b, v = case.logits.shape
    out = torch.empty(b, v)
    for i in range(b):
        x = case.logits[i].float().clone()
        if i in case.rows:
            count = torch.bincount(torch.tensor(case.generated[i]), minlength=v).float()
            seen = count > 0
            seen[case.prompt[i]] = True
            rep = case.repetition[i]
            x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
            x = x - count * case.frequency[i] - (count > 0).float() * case.presence[i]
            for tok, bias in case.bias[i].items():
                x[tok] += bias
        x = x.masked_fill(~case.allowed[i], float("-inf"))
        t = float(case.temperature[i]) or 1.0
        out[i] = torch.log_softmax(x / t, dim=-1)
    return out


def check_against_reference(case: Case, ids: torch.Tensor, logprobs: torch.Tensor,
                            top_ids: torch.Tensor, top_logprobs: torch.Tensor) -> None:
    """The kernel's output agrees with :func:`reference_logprobs`: greedy rows pick its argmax,
    every chosen token is allowed and carries its log-probability, and the top lists are its
    most likely allowed tokens, best first, with their log-probabilities."""
    ref = reference_logprobs(case)
    for i in range(ref.shape[0]):
        tok = int(ids[i])
        assert bool(case.allowed[i, tok]), f"row {i}: a masked token was chosen"
        if float(case.temperature[i]) == 0:
            assert tok == int(ref[i].argmax()), f"row {i}: not the greedy token"
        assert abs(float(logprobs[i]) - float(ref[i, tok])) < 1e-4, f"row {i}"
        k = int(case.num_top[i])
        want_lp, want_ids = ref[i].topk(k)
        want_ids, want_lp = want_ids[torch.isfinite(want_lp)], want_lp[torch.isfinite(want_lp)]
        got = top_ids[i][top_ids[i] >= 0]
        assert got.tolist() == want_ids.tolist(), f"row {i}: top ids"
        assert bool(case.allowed[i, got].all())
        torch.testing.assert_close(top_logprobs[i, :got.numel()], want_lp, rtol=1e-5, atol=1e-4)
        assert bool(torch.isneginf(top_logprobs[i, got.numel():]).all())
