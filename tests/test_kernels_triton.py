"""The Triton fused sample kernel against the torch reference: same tokens (greedy and seeded
sampling), same log-probabilities. On a CPU-only machine the kernel runs in the Triton
interpreter; with a GPU it runs compiled, on CUDA tensors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields

import pytest
import torch
from bitmask_helpers import pack_bitmask as _pack
from controls_helpers import CONTROLS, check_against_reference, make_case
from grammarserve_kernels import Sampled, SamplingControls, stream_keys
from grammarserve_kernels.sample_ref import sample_tokens_ref

ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    # NOTE: the interpreter is chosen when triton is first imported (its jit'd standard library
    # is built then). On a CPU-only machine Triton can only interpret, so this affects nothing else.
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
# The interpreter evaluates log(0) and -inf - -inf in lanes the kernel then discards.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

Result = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def kernel() -> Callable[..., Result]:
    """``sample_tokens_triton`` taking CPU tensors and returning CPU tensors."""
    if not ON_GPU and not triton.knobs.runtime.interpret:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run this file alone")
    from grammarserve_kernels.sample_triton import sample_tokens_triton

    def run(*args: torch.Tensor | None) -> Result:
        dev = "cuda" if ON_GPU else "cpu"
        ids, logprobs, *_ = sample_tokens_triton(*(a if a is None else a.to(dev) for a in args))
        return ids.cpu(), logprobs.cpu()

    return run


def _case(b: int, v: int, dtype: torch.dtype, seed: int, *, masked: bool = True
          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Random logits; a mix of unconstrained, dense, sparse, single-token and empty mask rows;
    greedy and sampled rows."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, v, generator=g) * 3).to(dtype)
    temperature = torch.tensor([0.0, 1.0, 0.6, 1.7][: b] + [0.0, 0.8] * b)[:b]
    temperature = temperature[torch.randperm(b, generator=g)]
    if not masked:
        return logits, None, temperature, stream_keys(range(b), [seed] * b)
    allowed = torch.rand(b, v, generator=g) < torch.rand(b, 1, generator=g)
    kinds = torch.randint(0, 5, (b,), generator=g)
    allowed[kinds == 0] = True  # unconstrained (all ones)
    allowed[kinds == 1] &= torch.rand(int((kinds == 1).sum()), v, generator=g) < 0.01  # sparse
    for r in (kinds == 2).nonzero()[:, 0].tolist():  # one token, anywhere (last block too)
        allowed[r] = False
        allowed[r, int(torch.randint(0, v, (1,), generator=g))] = True
    if b > 2:
        allowed[b // 2] = False  # nothing allowed
    return logits, _pack(allowed), temperature, stream_keys(range(b), [seed] * b)


def _assert_same(ref: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...]) -> None:
    assert got[0].tolist() == ref[0].tolist()
    assert torch.equal(torch.isneginf(got[1]), torch.isneginf(ref[1]))
    finite = torch.isfinite(ref[1])
    torch.testing.assert_close(got[1][finite], ref[1][finite], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize(("b", "v", "dtype", "seed"), [
    (1, 1000, torch.float32, 0),
    (5, 3001, torch.bfloat16, 1),
    (64, 1500, torch.float32, 2),
    (17, 4999, torch.bfloat16, 3),
    (9, 2048, torch.float16, 4),
    (33, 1057, torch.bfloat16, 5),
])
def test_triton_matches_reference(kernel: Callable[..., Result], b: int, v: int,
                                  dtype: torch.dtype, seed: int) -> None:
    logits, bitmask, temperature, keys = _case(b, v, dtype, seed)
    assert bitmask is not None
    ref = sample_tokens_ref(logits, bitmask, temperature, keys)
    _assert_same(ref, kernel(logits, bitmask, temperature, keys))
    assert (ref[0] == -1).tolist() == [bool(bitmask[r].eq(0).all()) for r in range(b)]


def test_triton_without_bitmask_and_strided_rows(kernel: Callable[..., Result]) -> None:
    logits, _, temperature, keys = _case(12, 2500, torch.float32, 6, masked=False)
    wide = torch.full((12, 2600), 50.0)
    wide[:, :2500] = logits
    strided = wide[:, :2500]  # row stride 2600: the kernel must not read past V
    ref = sample_tokens_ref(logits, None, temperature, keys)
    _assert_same(ref, kernel(strided, None, temperature, keys))


def test_triton_greedy_ties_pick_the_first_index(kernel: Callable[..., Result]) -> None:
    logits = torch.zeros(3, 3000, dtype=torch.bfloat16)
    logits[:, [5, 1500, 2999]] = 2.0
    logits[1, 5] = 0.0  # first max in the second block
    logits[2, :1024] = 2.0  # a whole block of ties
    zeros = torch.zeros(3)
    ref = sample_tokens_ref(logits, None, zeros, stream_keys([0] * 3, [0] * 3))
    got = kernel(logits, None, zeros, stream_keys([0] * 3, [0] * 3))
    assert ref[0].tolist() == got[0].tolist() == [5, 1500, 0]


def test_triton_matches_reference_at_qwen_vocab(kernel: Callable[..., Result]) -> None:
    logits, bitmask, temperature, keys = _case(1, 151_936, torch.bfloat16, 7)
    temperature[:] = 0.9
    _assert_same(sample_tokens_ref(logits, bitmask, temperature, keys),
                 kernel(logits, bitmask, temperature, keys))


def test_kernel_compiles_for_cuda() -> None:
    """The interpreter accepts more than the compiler: build real sm_90 code (no GPU needed)."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("Triton has no NVIDIA backend here")
    script = (
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource, compile\n"
        "from grammarserve_kernels.sample_triton import _fused_sample_kernel as k\n"
        "sig = {'logits_ptr': '*bf16', 'stride_logits': 'i32', 'mask_ptr': '*i32',\n"
        "       'stride_mask': 'i32', 'temp_ptr': '*fp32', 'key_ptr': '*i64',\n"
        "       'out_ids_ptr': '*i64', 'out_logprobs_ptr': '*fp32', 'V': 'i32',\n"
        "       'ctl_rows_ptr': '*i64', 'counts_ptr': '*i32', 'prompt_ptr': '*u8',\n"
        "       'bias_ptr': '*fp32', 'stride_ctl': 'i32', 'freq_ptr': '*fp32',\n"
        "       'pres_ptr': '*fp32', 'rep_ptr': '*fp32', 'top_rows_ptr': '*i64',\n"
        "       'ybuf_ptr': '*fp32', 'lse_ptr': '*fp32', 'HAS_MASK': 'constexpr',\n"
        "       'HAS_CONTROLS': 'constexpr', 'HAS_TOP': 'constexpr', 'BLOCK': 'constexpr'}\n"
        "src = ASTSource(k, sig, constexprs={'HAS_MASK': True, 'HAS_CONTROLS': True,\n"
        "                                    'HAS_TOP': True, 'BLOCK': 1024})\n"
        "assert 'cubin' in compile(src, target=GPUTarget('cuda', 90, 32)).asm\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


# -- OpenAI sampling controls (penalties, logit bias) and top logprobs ------------------------
@pytest.fixture(scope="module")
def full_kernel() -> Callable[..., Sampled]:
    """``sample_tokens_triton`` with controls and top logprobs, CPU tensors in and out."""
    if not ON_GPU and not triton.knobs.runtime.interpret:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run this file alone")
    from grammarserve_kernels.sample_triton import sample_tokens_triton

    def run(logits: torch.Tensor, bitmask: torch.Tensor | None, temperature: torch.Tensor,
            keys: torch.Tensor, controls: SamplingControls | None,
            num_top: torch.Tensor | None) -> Sampled:
        dev = "cuda" if ON_GPU else "cpu"
        moved = None if controls is None else SamplingControls(
            **{f.name: getattr(controls, f.name).to(dev) for f in fields(controls)})
        out = sample_tokens_triton(
            logits.to(dev), None if bitmask is None else bitmask.to(dev), temperature.to(dev),
            keys.to(dev), controls=moved, num_top=None if num_top is None else num_top.to(dev))
        return Sampled(*(t.cpu() for t in out))

    return run


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("control", CONTROLS)
def test_triton_applies_each_control(full_kernel: Callable[..., Sampled], control: str,
                                     masked: bool) -> None:
    case = make_case(control, masked=masked, seed=10 + CONTROLS.index(control))
    args = (case.logits, case.bitmask, case.temperature, case.keys, case.controls(),
            case.num_top)
    got = full_kernel(*args)
    check_against_reference(case, *got)
    ref = sample_tokens_ref(*args[:4], controls=args[4], num_top=args[5])
    _assert_same(ref[:2], got[:2])
    _assert_same_top(ref, got)


def _assert_same_top(ref: Sampled, got: Sampled) -> None:
    """Same top log-probabilities; the same ids up to the order of exactly tied values (bf16
    logits tie often, and CPU and CUDA topk order ties differently; a tie that runs past the
    end of a row's list may also pick different tokens: seen in the first compiled runs)."""
    torch.testing.assert_close(got.top_logprobs, ref.top_logprobs, rtol=1e-5, atol=2e-5)
    for r_ids, r_lps, g_ids in zip(ref.top_ids.tolist(), ref.top_logprobs.tolist(),
                                   got.top_ids.tolist()):
        groups: dict[float, tuple[set[int], set[int]]] = {}
        for rid, lp, gid in zip(r_ids, r_lps, g_ids):
            a, b = groups.setdefault(lp, (set(), set()))
            a.add(rid)
            b.add(gid)
        # NOTE: a row's list ends at its own num_top (then -inf padding): its last finite value
        # is where a tie may be cut
        finite = [lp for lp in r_lps if lp != float("-inf")]
        last = finite[-1] if finite else None
        for lp, (a, b) in groups.items():
            assert a == b or lp == last, f"top ids differ beyond ties at logprob {lp}"


def test_triton_controls_in_half_precision_and_top_without_controls(
        full_kernel: Callable[..., Sampled]) -> None:
    case = make_case("all", masked=True, b=7, v=3001, seed=20, dtype=torch.bfloat16)
    for controls in (case.controls(), None):
        args = (case.logits, case.bitmask, case.temperature, case.keys, controls,
                case.num_top)
        ref = sample_tokens_ref(*args[:4], controls=controls, num_top=case.num_top)
        got = full_kernel(*args)
        _assert_same(ref[:2], got[:2])
        _assert_same_top(ref, got)
