"""Command line: ``grammarserve serve`` (OpenAI-compatible server), ``grammarserve generate``
(one-shot) and ``grammarserve chat`` (REPL)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from grammarserve.batch import cli as batch_cli
from grammarserve.config import EngineConfig
from grammarserve.errors import GrammarserveError, ModelLoadError
from grammarserve.fsm.reasoning_formats import NAMES as REASONING_NAMES
from grammarserve.openai.tool_detect import PARSER_NAMES
from grammarserve.sampling_params import SamplingParams
from grammarserve.server.config import RestartPolicy, ServerConfig
from grammarserve.server.timeouts import ReadTimeouts, protocol_class


def _engine_args(p: argparse.ArgumentParser) -> None:
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
                        "at most a quarter of available memory; 0: off)")
    p.add_argument("--kv-disk-tier-dir", dest="kv_disk_tier", default=EngineConfig.kv_disk_tier,
                   metavar="DIR", help="disk tier of prompt KV, kept across restarts and shared "
                   "by the machine's replicas ('auto': $GRAMMARSERVE_KV_TIER, else "
                   "~/.cache/grammarserve/kv; default: off)")
    p.add_argument("--kv-disk-tier-bytes", type=int, default=EngineConfig.kv_disk_tier_bytes,
                   help="upper bound of the disk tier's folder")
    p.add_argument("--kv-tier-dtype", default=EngineConfig.kv_tier_dtype,
                   choices=["float32", "bfloat16", "float16"],
                   help="storage dtype of the tiers' KV (default: the pool's, bit-exact)")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def _server_args(p: argparse.ArgumentParser) -> None:
    """``serve``'s limits, engine supervision and API keys."""
    d, r = ServerConfig, RestartPolicy
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="largest request body (413 beyond; /v1/files has its own limit)")
    p.add_argument("--max-upload-bytes", type=int, default=d.max_upload_bytes,
                   help="largest /v1/files upload (413 beyond; streamed to disk)")
    p.add_argument("--max-tenant-bytes", type=int, default=d.max_tenant_bytes,
                   help="bytes of files (uploads, batch outputs) one tenant may store (413)")
    p.add_argument("--max-prompt-chars", type=int, default=None,
                   help="characters of a prompt refused before tokenizing (default: context "
                        "length x the longest token, a bound no prompt that fits can exceed)")
    p.add_argument("--max-request-choices", type=int, default=d.max_request_choices,
                   help="engine requests (prompts x n) one request may ask for (400 beyond)")
    p.add_argument("--max-json-depth", type=int, default=d.max_json_depth,
                   help="deepest nesting of a request body's JSON (400 beyond, before parsing)")
    t = ReadTimeouts()
    p.add_argument("--header-timeout", type=float, default=t.header_s,
                   help="seconds a request's headers may take to arrive (408 and closed)")
    p.add_argument("--body-timeout", type=float, default=t.body_s,
                   help="longest pause, in seconds, inside a request body (408 and closed)")
    p.add_argument("--engine-max-restarts", type=int, default=r.max_restarts,
                   help="restarts of a dead engine allowed within --engine-restart-window; one "
                        "more death and the server exits with status 2 (0: never restart)")
    p.add_argument("--engine-restart-window", type=float, default=r.window_s,
                   help="seconds --engine-max-restarts counts in")
    p.add_argument("--engine-restart-backoff", type=float, default=r.backoff_s,
                   help="seconds before the first restart, doubled per death in the window "
                        f"(at most {r.max_backoff_s:.0f})")
    p.add_argument("--api-key", action="append", default=[], metavar="'KEY [TENANT]'",
                   help="accept 'Authorization: Bearer KEY' (repeatable); a tenant, if given, "
                        "is the key's cache namespace and owns its files and batches")
    p.add_argument("--api-keys-file", type=Path, default=None,
                   help="API keys, one 'KEY [TENANT]' per line (# comments); keeps keys out "
                        "of the process list")


def _ray_args(p: argparse.ArgumentParser, *, serve: bool = True) -> None:
    """``serve --ray`` (N engine replicas on Ray Serve) and ``batch --ray`` (an actor pool of
    engines on Ray Data); the extra ``grammarserve[ray]``."""
    p.add_argument("--ray", action="store_true",
                   help="serve with Ray Serve: --replicas engine replicas behind a prefix- and "
                        "grammar-aware router (needs grammarserve[ray])" if serve else
                        "run on Ray Data: --replicas engine actors, lines grouped by prompt "
                        "(needs grammarserve[ray])")
    p.add_argument("--address", default=None,
                   help="with --ray: the Ray cluster to join ('auto', or HOST:PORT); default: "
                        "start a local Ray instance")
    p.add_argument("--replicas", type=int, default=1, help="with --ray: engine replicas")
    if not serve:
        return
    p.add_argument("--router", default="prefix_grammar",
                   choices=["prefix_grammar", "power_of_two", "round_robin"],
                   help="with --ray: how a request's replica is chosen")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grammarserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate completions for prompts given as arguments")
    gen.add_argument("prompts", nargs="+", help="user messages (chat template applied)")
    gen.add_argument("--raw", action="store_true", help="send prompts as-is, no chat template")
    chat = sub.add_parser("chat", help="read user messages from stdin, one per line, and reply")
    for p in (gen, chat):
        _engine_args(p)
        _sampling_args(p)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    _engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None,
                       help="model id reported by the API (default: from the model path)")
    serve.add_argument("--max-n", type=int, default=ServerConfig.max_n,
                       help="largest n (choices per request)")
    serve.add_argument("--max-pending-requests", type=int,
                       default=ServerConfig.max_pending_requests,
                       help="engine requests in flight beyond which requests get 503")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"])
    serve.add_argument("--data-dir", type=Path, default=None,
                       help="batch API files and state (default ~/.local/share/grammarserve)")
    _server_args(serve)
    _ray_args(serve)
    _ray_args(batch_cli.add_parser(sub, _engine_args), serve=False)
    return parser


def _config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(model=args.model, dtype=args.dtype, device=args.device,
                        chat_template=args.chat_template,
                        attention_backend=args.attention_backend,
                        cuda_graphs=args.cuda_graphs,
                        kv_cache_tokens=args.kv_cache_tokens,
                        max_batch_tokens=args.max_batch_tokens, max_num_reqs=args.max_num_reqs,
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
                        decode_attention_kernel=args.decode_attention_kernel,
                        decode_stack_kernel=args.decode_stack_kernel)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from grammarserve.models.loader import default_model_path
    from grammarserve.server import create_app

    if args.model == "default":
        default_model_path()  # fail now, not after the server started, if it is missing
    elif not Path(args.model).expanduser().exists():
        raise ModelLoadError(f"model path {args.model!r} does not exist")
    from grammarserve.server.auth import load_api_keys

    keys = load_api_keys(args.api_key, args.api_keys_file)
    restart = RestartPolicy(max_restarts=args.engine_max_restarts,
                            window_s=args.engine_restart_window,
                            backoff_s=args.engine_restart_backoff)
    config = ServerConfig(engine=_config(args), served_model_name=args.served_model_name,
                          max_n=args.max_n, max_pending_requests=args.max_pending_requests,
                          data_dir=args.data_dir, restart=restart,
                          max_body_bytes=args.max_body_bytes,
                          max_upload_bytes=args.max_upload_bytes,
                          max_tenant_bytes=args.max_tenant_bytes,
                          max_prompt_chars=args.max_prompt_chars,
                          max_request_choices=args.max_request_choices,
                          max_json_depth=args.max_json_depth, api_keys=keys)
    if not keys and not _loopback(args.host):
        logging.getLogger("grammarserve").warning(
            "serving on %s without API keys: anyone who can reach it may use the model and "
            "read every file and batch (give --api-key or --api-keys-file)", args.host)
    failure: list[str] = []
    server: uvicorn.Server | None = None

    def on_failure(message: str) -> None:
        failure.append(message)
        if server is not None:
            server.should_exit = True

    if args.ray:
        from grammarserve.cluster import require_ray

        require_ray()
        from grammarserve.cluster.serve import RayServeConfig, run

        print(f"grammarserve: serving {args.model} on Ray ({args.replicas} replicas, router "
              f"{args.router}) at http://{args.host}:{args.port}/v1", file=sys.stderr,
              flush=True)
        run(RayServeConfig(config, replicas=args.replicas, router=args.router),
            address=args.address, host=args.host, port=args.port)
        return 0
    app = create_app(config, on_failure=on_failure)
    timeouts = ReadTimeouts(header_s=args.header_timeout, body_s=args.body_timeout)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level, timeout_keep_alive=30,
                                           http=protocol_class(timeouts)))
    print(f"grammarserve: serving {args.model} on http://{args.host}:{args.port}/v1 "
          f"(loading; GET /health answers 200 when ready)", file=sys.stderr, flush=True)
    server.run()
    if failure:
        raise GrammarserveError(failure[0])
    return 0


def _loopback(host: str) -> bool:
    """Whether ``host`` binds only the loopback interface."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def _run(args: argparse.Namespace) -> int:
    from grammarserve.llm import LLM

    if args.command == "serve":
        return _serve(args)
    if args.command == "batch" and args.ray:
        from grammarserve.cluster import require_ray

        require_ray()
        from grammarserve.cluster import data

        return data.main(args, _config(args))
    if args.command == "batch":
        return batch_cli.main(args, _config(args))

    config = _config(args)
    params = _params(args)
    t0 = time.perf_counter()
    llm = LLM(config.model, config=config)
    print(f"loaded {config.model} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    def render(text: str, history: list[dict[str, str]]) -> str:
        if getattr(args, "raw", False):
            return text
        msgs = history + [{"role": "user", "content": text}]
        return str(llm.tokenizer.apply_chat_template(msgs, tokenize=False,
                                                     add_generation_prompt=True))

    if args.command == "generate":
        t0 = time.perf_counter()
        outs = llm.generate([render(p, []) for p in args.prompts], params)
        n = sum(len(o.token_ids) for o in outs)
        for o in outs:
            print(o.text)
        dt = time.perf_counter() - t0
        print(f"{len(outs)} completions, {n} tokens in {dt:.2f}s ({n / dt:.1f} tok/s)",
              file=sys.stderr)
        return 0
    history: list[dict[str, str]] = []
    for line in sys.stdin:
        text = line.strip()
        if not text:
            continue
        reply = llm.generate(render(text, history), params)[0].text
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        print(reply, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``grammarserve`` command; user errors exit 2 with one line."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("grammarserve").setLevel(logging.INFO)  # start-up report: KV pool, RSS
    try:
        return _run(args)
    except GrammarserveError as e:
        print(f"grammarserve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
