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
from grammarserve.cli_engine import engine_args, engine_config
from grammarserve.errors import GrammarserveError, ModelLoadError
from grammarserve.sampling_params import SamplingParams
from grammarserve.server.config import RestartPolicy, ServerConfig
from grammarserve.server.timeouts import ReadTimeouts, protocol_class


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
    p.add_argument("--engine-max-request-crashes", type=int, default=r.max_request_crashes,
                   help="engine deaths blamed on a request (a native crash compiling its "
                        "constraint, refused from then on) restarted at the normal backoff "
                        "within --engine-restart-window; beyond, each restart waits "
                        f"{r.max_backoff_s:.0f} s (they never end the server)")
    p.add_argument("--engine-stall-timeout", type=float, default=r.stall_timeout_s,
                   help="seconds without a heartbeat from the engine (stopped, wedged) after "
                        "which it is killed, its requests get 503 and it is restarted")
    p.add_argument("--engine-step-timeout", type=float, default=r.step_timeout_s,
                   help="longest one engine step may run before the same")
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
        engine_args(p)
        _sampling_args(p)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    engine_args(serve)
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
    _ray_args(batch_cli.add_parser(sub, engine_args), serve=False)
    return parser


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
                            backoff_s=args.engine_restart_backoff,
                            max_request_crashes=args.engine_max_request_crashes,
                            stall_timeout_s=args.engine_stall_timeout,
                            step_timeout_s=args.engine_step_timeout)
    config = ServerConfig(engine=engine_config(args), served_model_name=args.served_model_name,
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

        return data.main(args, engine_config(args))
    if args.command == "batch":
        return batch_cli.main(args, engine_config(args))

    config = engine_config(args)
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
