"""The engine's options on the command line: the flags of ``generate``, ``chat``, ``serve`` and
``batch`` that make an :class:`EngineConfig` (:func:`engine_args` adds them, :func:`engine_config`
reads them back)."""

from __future__ import annotations

import argparse

from grammarserve.config import EngineConfig
from grammarserve.fsm.reasoning_formats import NAMES as REASONING_NAMES
from grammarserve.openai.tool_detect import PARSER_NAMES


def engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a HF folder or a GGUF file")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template file (or its text) replacing the model's; the "
                        "tool-call format and reasoning markers follow its family")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights and KV (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--attention-backend", default=EngineConfig.attention_backend,
                   choices=["auto", "torch", "varlen"],
                   help="auto: varlen flash attention on CUDA, torch SDPA + CPU kernels on CPU")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--cuda-graphs", default=EngineConfig.cuda_graphs,
                   action=argparse.BooleanOptionalAction,
                   help="on CUDA, replay decode steps as CUDA graphs (one per padded batch size)")
    p.add_argument("--kv-cache-tokens", type=int, default=EngineConfig.kv_cache_tokens)
    p.add_argument("--max-batch-tokens", type=int, default=EngineConfig.max_batch_tokens)
    p.add_argument("--step-time-target-s", type=float, default=EngineConfig.step_time_target_s,
                   help="while requests decode, cap each step's prefill tokens so that a step "
                        "takes about this long (measured); 0: off (default: %(default)s)")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch CPU threads of the engine (default: torch's choice; use 1 on a "
                        "busy machine)")
    p.add_argument("--max-num-reqs", type=int, default=EngineConfig.max_num_reqs,
                   help="requests holding KV at once")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest sequence (default: the model's, capped by the KV pool)")
    p.add_argument("--grammar-backend", default=EngineConfig.grammar_backend,
                   choices=["auto", "llguidance", "xgrammar"])
    p.add_argument("--json-style", default=EngineConfig.grammar_json_style,
                   choices=["auto", "compact", "spaced", "indented", "flexible"],
                   help="JSON whitespace of constrained output (flexible: any, as the model "
                        "writes it; auto: the model picks compact or spaced where its output "
                        "first shows one, then locked)")
    p.add_argument("--grammar-max-whitespace", type=int,
                   default=EngineConfig.grammar_max_whitespace,
                   help="longest whitespace run between JSON tokens in the flexible style "
                        "(-1: unbounded)")
    p.add_argument("--grammar-max-depth", type=int, default=EngineConfig.grammar_max_depth,
                   help="deepest nesting of a JSON schema (JSON levels) or of a regex's or "
                        "grammar's parentheses (400 beyond)")
    p.add_argument("--open-schemas", default=EngineConfig.grammar_open_schemas,
                   action=argparse.BooleanOptionalAction,
                   help="generate anything a schema allows (default: only named properties, "
                        "integers within +-2**53, at most 20 digits in a row)")
    p.add_argument("--value-checks", default=EngineConfig.grammar_value_checks,
                   action=argparse.BooleanOptionalAction,
                   help="check keywords no grammar holds (uniqueItems on strings, contains, "
                        "what 'not' leaves) when their value closes, rolling back and retrying "
                        "on failure (--no-value-checks: refuse such schemas)")
    p.add_argument("--check-retries", type=int, default=EngineConfig.grammar_check_retries,
                   help="failed value checks a request may retry before it ends with an error")
    p.add_argument("--grammar-disk-cache", default=EngineConfig.grammar_disk_cache,
                   metavar="DIR",
                   help="folder of validated schemas and compiled grammars kept across restarts "
                        "and shared by processes (default: $GRAMMARSERVE_GRAMMAR_CACHE, else "
                        "~/.cache/grammarserve/grammars)")
    p.add_argument("--no-grammar-disk-cache", dest="grammar_disk_cache", action="store_const",
                   const=None, help="keep compiled grammars in memory only")
    p.add_argument("--grammar-disk-cache-bytes", type=int,
                   default=EngineConfig.grammar_disk_cache_bytes,
                   help="upper bound of the grammar disk cache's folder")
    p.add_argument("--jump-forward", default=EngineConfig.enable_jump_forward,
                   action=argparse.BooleanOptionalAction,
                   help="feed the tokens a constraint forces without decoding them one by one")
    p.add_argument("--json-schema-spans", default=EngineConfig.json_schema_spans,
                   action=argparse.BooleanOptionalAction,
                   help="also jump forward the key names a JSON schema forces (default: the "
                        "model spells them under the mask; tool calls jump forward either way)")
    p.add_argument("--loop-guard", type=int, default=EngineConfig.loop_guard,
                   help="in JSON-schema replies, take back the N-th exact copy of an earlier "
                        "object item of an array and close the array there (0: off)")
    p.add_argument("--canonical-spans", default=EngineConfig.canonical_spans,
                   action=argparse.BooleanOptionalAction,
                   help="tokenize each forced span as the tokenizer writes its text in context "
                        "(--no-canonical-spans: the grammar backend's own tokenization)")
    p.add_argument("--dry-multiplier", type=float, default=EngineConfig.dry_multiplier,
                   help="DRY penalty on tokens that extend a repetition inside a constrained "
                        "reply's string values, for requests that do not set dry_multiplier "
                        "(0: off)")
    p.add_argument("--num-speculative-tokens", type=int,
                   default=EngineConfig.num_speculative_tokens,
                   help="speculative decoding: draft tokens per request and step at most, from "
                        "the prompt, the reply and earlier replies (0: off)")
    p.add_argument("--speculative-adaptive", default=EngineConfig.speculative_adaptive,
                   action=argparse.BooleanOptionalAction,
                   help="draft only as much as measured step costs and acceptance say pays")
    p.add_argument("--tool-call-format", default=EngineConfig.tool_call_format,
                   choices=["json_array", "hermes"],
                   help="tool calls for tool_choice required/named: one JSON array of "
                        "{name, parameters} (json_array) or <tool_call> blocks (hermes)")
    p.add_argument("--reasoning-parser", default=EngineConfig.reasoning_parser,
                   choices=REASONING_NAMES,
                   help="the reasoning format of the model's replies (vLLM's names; none: "
                        "no reasoning span; default: read from the chat template)")
    p.add_argument("--strict-thinking", default=EngineConfig.strict_thinking,
                   action=argparse.BooleanOptionalAction,
                   help="no stop token and no tool-call marker inside the reasoning span, for "
                        "requests that do not set strict_thinking")
    p.add_argument("--tool-call-parser", default=EngineConfig.tool_call_parser,
                   choices=PARSER_NAMES,
                   help="the model family's tool-call format (vLLM's names); auto: read from the "
                        "chat template, else --tool-call-format")
    p.add_argument("--tool-call-dedupe", default=EngineConfig.tool_call_dedupe,
                   action=argparse.BooleanOptionalAction,
                   help="end a reply when a tool call repeats an earlier one byte for byte")
    p.add_argument("--gguf-blocks", default=EngineConfig.gguf_blocks,
                   action=argparse.BooleanOptionalAction,
                   help="CPU decode matmuls on the GGUF's own Q4_1/Q8_0 blocks (AVX2 kernel)")
    p.add_argument("--quant-activations", default=EngineConfig.quant_activations,
                   choices=["int8x2", "int8", "fp32"],
                   help="activations of those matmuls: int8 blocks plus their int8 residual "
                        "(int8x2, default), one int8 level (int8: faster, less exact) or fp32 "
                        "(exact); integer kernels dispatched for AVX2/AVX-512/VNNI")
    p.add_argument("--prefill-matmul", default=EngineConfig.prefill_matmul,
                   choices=["auto", "int8x2", "int8", "bf16"],
                   help="matmuls of prefill-sized batches (256 rows and more): the int8x2 "
                        "kernel (default: a row's result never depends on its batch), auto (bf16 "
                        "where the CPU grants AMX tiles, else int8x2), one int8 level (int8: ~2x "
                        "faster, llama.cpp's numerics) or bf16 GEMM on dequantized panels (bf16: "
                        "AMX tiles where the CPU has them; ~3x faster prompts there)")
    p.add_argument("--decode-attention-kernel", default=EngineConfig.decode_attention_kernel,
                   action=argparse.BooleanOptionalAction,
                   help="CPU decode attention with the fused C++ kernel (off: torch matmuls)")
    p.add_argument("--adaptive-threads", default=EngineConfig.adaptive_threads,
                   action=argparse.BooleanOptionalAction,
                   help="on CPU, run each step on one thread or all of them as measured step "
                        "times say (off: always --num-threads)")
    p.add_argument("--adaptive-batch", default=EngineConfig.adaptive_batch,
                   action=argparse.BooleanOptionalAction,
                   help="cap the requests running at once at the decode batch size that gives "
                        "the most tokens/s as measured (off: up to --max-num-reqs)")
    p.add_argument("--decode-stack-kernel", default=EngineConfig.decode_stack_kernel,
                   action=argparse.BooleanOptionalAction,
                   help="CPU decode steps run all decoder layers in one C++ call (off: layer by "
                        "layer in torch)")
    p.add_argument("--prefix-cache", default=EngineConfig.enable_prefix_cache,
                   action=argparse.BooleanOptionalAction, help="radix prefix cache on/off")
    p.add_argument("--kv-host-tier-bytes", type=int, default=EngineConfig.kv_host_tier_bytes,
                   help="host-memory tier for evicted prefixes' KV (default: the pool's size, "
                        "at most a quarter of the memory left after the weights; 0: off)")
    p.add_argument("--kv-disk-tier-dir", dest="kv_disk_tier", default=EngineConfig.kv_disk_tier,
                   metavar="DIR", help="disk tier of prompt KV, kept across restarts and shared "
                   "by the machine's replicas ('auto': $GRAMMARSERVE_KV_TIER, else "
                   "~/.cache/grammarserve/kv; default: off)")
    p.add_argument("--kv-disk-tier-bytes", type=int, default=EngineConfig.kv_disk_tier_bytes,
                   help="upper bound of the disk tier's folder")
    p.add_argument("--kv-tier-dtype", default=EngineConfig.kv_tier_dtype,
                   choices=["float32", "bfloat16", "float16"],
                   help="storage dtype of the tiers' KV (default: the pool's, bit-exact)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(model=args.model, dtype=args.dtype, device=args.device,
                        chat_template=args.chat_template,
                        attention_backend=args.attention_backend,
                        cuda_graphs=args.cuda_graphs,
                        kv_cache_tokens=args.kv_cache_tokens,
                        max_batch_tokens=args.max_batch_tokens, max_num_reqs=args.max_num_reqs,
                        step_time_target_s=args.step_time_target_s,
                        max_model_len=args.max_model_len,
                        enable_prefix_cache=args.prefix_cache,
                        kv_host_tier_bytes=args.kv_host_tier_bytes,
                        kv_disk_tier=args.kv_disk_tier,
                        kv_disk_tier_bytes=args.kv_disk_tier_bytes,
                        kv_tier_dtype=args.kv_tier_dtype,
                        grammar_backend=args.grammar_backend,
                        grammar_json_style=args.json_style,
                        grammar_max_whitespace=(None if args.grammar_max_whitespace < 0
                                                else args.grammar_max_whitespace),
                        grammar_open_schemas=args.open_schemas,
                        grammar_value_checks=args.value_checks,
                        grammar_check_retries=args.check_retries,
                        grammar_max_depth=args.grammar_max_depth,
                        grammar_disk_cache=args.grammar_disk_cache,
                        grammar_disk_cache_bytes=args.grammar_disk_cache_bytes,
                        enable_jump_forward=args.jump_forward,
                        json_schema_spans=args.json_schema_spans,
                        loop_guard=args.loop_guard,
                        canonical_spans=args.canonical_spans,
                        dry_multiplier=args.dry_multiplier, num_threads=args.num_threads,
                        num_speculative_tokens=args.num_speculative_tokens,
                        speculative_adaptive=args.speculative_adaptive,
                        adaptive_threads=args.adaptive_threads,
                        adaptive_batch=args.adaptive_batch,
                        tool_call_format=args.tool_call_format,
                        tool_call_parser=args.tool_call_parser,
                        tool_call_dedupe=args.tool_call_dedupe,
                        reasoning_parser=args.reasoning_parser,
                        strict_thinking=args.strict_thinking, gguf_blocks=args.gguf_blocks,
                        quant_activations=args.quant_activations,
                        prefill_matmul=args.prefill_matmul,
                        decode_attention_kernel=args.decode_attention_kernel,
                        decode_stack_kernel=args.decode_stack_kernel)
