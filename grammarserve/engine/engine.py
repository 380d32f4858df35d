"""The engine: owns model runner, scheduler, radix cache and requests; ``step()`` advances them."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from concurrent.futures import FIRST_COMPLETED, wait

import torch

from grammarserve.attention.kv_pool import KVPool
from grammarserve.attention.staging import to_device
from grammarserve.config import EngineConfig
from grammarserve.engine.batch_size import BatchSizer
from grammarserve.engine.detokenizer import IncrementalDetokenizer
from grammarserve.engine.device import setup_cuda
from grammarserve.engine.dry import DryPenalty
from grammarserve.engine.grammar import GrammarRunner
from grammarserve.engine.heap import heap_usage, trim_heap
from grammarserve.engine.kv_tiers.build import build_tiers
from grammarserve.engine.memory import (
    check_weights_fit,
    model_bytes,
    plan_engine_memory,
    process_rss_bytes,
)
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.engine.radix_cache import DEFAULT_NAMESPACE, RadixCache
from grammarserve.engine.request import Req, ReqStatus, RequestOutput
from grammarserve.engine.sampler import SampleOutput, TopEntry, make_rng, sample
from grammarserve.engine.scheduler import ScheduledReq, Scheduler, logit_rows
from grammarserve.engine.spec.calibrate import calibrate
from grammarserve.engine.spec.ngram import space_folded
from grammarserve.engine.spec.speculator import SpecOptions, Speculator
from grammarserve.engine.stats import (
    EngineStats,
    disk_fields,
    failure_fields,
    heap_fields,
    plan_fields,
    tier_fields,
)
from grammarserve.engine.step_pacer import StepPacer
from grammarserve.engine.stopping import append_token, retract
from grammarserve.engine.threads import ThreadTuner
from grammarserve.engine.validate import check_bias, check_prompt
from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.fsm.failures import FAILURES
from grammarserve.fsm.repeats import CallRepeatGuard
from grammarserve.models.loader import LoadedModel, load_model
from grammarserve.models.prompt_tokens import SegmentEncoder
from grammarserve.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class Engine:
    """Continuous-batching generation engine (in-process; see ``LLM`` and ``EngineProcess``)."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        config = config.resolved()
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        device = config.torch_device
        if device.type == "cuda":
            setup_cuda(device, tf32=config.tf32)
        if loaded is None:  # NOTE: refuse a model that cannot fit before reading it
            check_weights_fit(config)
        self.loaded = loaded or load_model(config.model, dtype=config.torch_dtype, device=device,
                                           cache_dir=config.cache_dir,
                                           gguf_blocks=config.gguf_blocks,
                                           quant_activations=config.quant_activations,
                                           prefill_matmul=config.prefill_matmul,
                                           chat_template=config.chat_template)
        trim_heap()  # before the memory plan counts what is available
        mc = self.loaded.config
        self.tokenizer = self.loaded.tokenizer
        self.vocab_size = mc.vocab_size  # NOTE: the one bound of token ids (engine/validate.py)
        self.prompt_encoder = SegmentEncoder(self.tokenizer)  # text prompts' cached pieces
        self.kv_bytes_per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads,
                                                         mc.head_dim, config.torch_kv_dtype)
        self.memory_plan = plan_engine_memory(config, mc, model_bytes(self.loaded.model),
                                              varlen=config.attention_backend == "varlen")
        capacity = self.memory_plan.kv_tokens
        # NOTE: one sequence must always fit in the pool alone, or preemption could livelock.
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings,
                                 mc.max_position_embeddings, capacity)
        self.runner = ModelRunner.build(self.loaded.model, config, capacity, self.max_model_len,
                                        mirror_tokens=self.memory_plan.mirror_tokens)
        pool, table = self.runner.pool, self.runner.req_to_token
        self.threads = ThreadTuner(torch.get_num_threads() if device.type == "cpu"
                                   and config.adaptive_threads else 1)
        self.sizer = BatchSizer(config.max_num_reqs, enabled=config.adaptive_batch)
        self.pacer = StepPacer(config.step_time_target_s, config.max_batch_tokens)
        eos = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)
        self.dry = DryPenalty(self.tokenizer, mc.vocab_size)
        self.grammar = GrammarRunner(self.tokenizer, config, vocab_size=mc.vocab_size,
                                     stop_token_ids=sorted(self.eos_ids))
        self.tiers = build_tiers(config, self.loaded.model, pool,
                                 self.grammar.compiler.vocab.fingerprint,
                                 host=self.memory_plan.host_tier_bytes) \
            if config.enable_prefix_cache else None
        self.cache = RadixCache(pool, self.tiers.demote if self.tiers else None) \
            if config.enable_prefix_cache else None
        self.scheduler = Scheduler(pool, table, self.cache, tiers=self.tiers,
                                   max_batch_tokens=config.max_batch_tokens)
        self.spec = Speculator(SpecOptions(max_draft=config.num_speculative_tokens,
                                           adaptive=config.speculative_adaptive),
                               max_model_len=self.max_model_len,
                               generated=lambda: self._counters["generated_tokens"]
                               - self.grammar.counters.jump_forward_tokens,
                               fold=space_folded(self.tokenizer.get_vocab(), mc.vocab_size))
        self.requests: dict[str, Req] = {}
        self._compiling: list[Req] = []  # constrained requests waiting for their grammar
        self._done_early: list[Req] = []  # aborted, or failed before running
        self._arrivals = itertools.count()
        self._counters = dict(prompt_tokens=0, cached_prompt_tokens=0, generated_tokens=0,
                              finished_requests=0, aborted_requests=0, forward_passes=0)
        log.info("memory plan: %s; KV %s; process RSS %.0f MiB", self.memory_plan.describe(),
                 pool.dtype, process_rss_bytes() / 2**20)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Queue a request; ``prompt`` is text (tokenized as is) or token ids. Requests only
        share cached prefixes with requests of the same ``namespace``."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use",
                                      param="request_id")
        ids = self.prompt_encoder.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids, vocab_size=self.vocab_size, max_model_len=self.max_model_len)
        check_bias(params, vocab_size=self.vocab_size)
        if params.dry_multiplier is None:  # NOTE: the engine's default, for constrained replies
            params = dataclasses.replace(params, dry_multiplier=self.config.dry_multiplier
                                         if params.constraint is not None else 0.0)
        rng = None if params.greedy else make_rng(params.seed)
        req = Req(request_id, ids, params, IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=params.skip_special_tokens),
            arrival=next(self._arrivals), rng=rng, namespace=namespace)
        if self.config.tool_call_dedupe and params.constraint is not None and \
                params.constraint.may_repeat_calls:
            req.repeat_guard = CallRepeatGuard(params.constraint.tool_format)
        self.requests[request_id] = req
        if params.constraint is None:
            if params.reasoning is not None:  # NOTE: only a reasoning span to enforce
                req.matcher = self.grammar.reasoning_only(req)
            self.scheduler.add(req)
            return
        self.grammar.start_compile(req)
        self._compiling.append(req)
        self._admit_compiled()

    def abort(self, request_id: str) -> None:
        """Stop a request; its final output (finish_reason ``abort``) comes from the next step."""
        req = self.requests.get(request_id)
        if req is not None and not req.finished:
            req.finish_reason = "abort"
            self._counters["aborted_requests"] += 1
            if req in self._compiling:  # a compile no request waits for any more is dropped
                self._compiling.remove(req)
                self.grammar.abandon(req)
            self.scheduler.finish(req)
            self._done_early.append(req)

    def warm_up(self) -> None:
        """Build what the first constrained request would otherwise build (the grammar
        backends' tokenizer tables, ~1 s, much of it holding the GIL, so every running request
        would wait), the loop guard's table, and speculation's cost of a draft token (a few
        forwards). Call it before serving."""
        self.grammar.warm_up()
        if self.spec.options.max_draft > 0 and self.spec.options.adaptive:
            calibrate(self.runner, self.spec.cost, next(self._arrivals))

    def close(self) -> None:
        """Write what the KV disk tier has queued and stop its threads and the grammar
        layer's (at shutdown; idempotent). The grammar layer stops even if the tiers fail."""
        try:
            if self.tiers is not None:
                self.tiers.close()
        finally:
            self.grammar.shutdown()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self._done_early or self._compiling)

    def step(self) -> list[RequestOutput]:
        """Schedule (with speculative drafts), fill the constrained rows' bitmasks while the
        model runs, sample, verify the drafts and advance the matchers (plus jump-forward
        spans), and return the outputs of requests that advanced."""
        self._admit_compiled()
        self.scheduler.max_running = self.sizer.limit()
        self.scheduler.prefill_cap = self.pacer.cap(self.scheduler.decoding)
        self.spec.propose(self.scheduler.running, self.grammar.forced_draft)
        work, entries = self._drafted(*self._batch(self.scheduler.schedule()))
        if not work:
            self._wait_for_compiles()
            return self._collect([])
        reqs = [w.req for w in work if w.samples]  # will sample
        rows = logit_rows(work)
        masks = self.grammar.fill_async(reqs)  # NOTE: overlaps the forward below
        tokens = sum(w.num_tokens for w in work)
        # NOTE: a grammar compiling on our threads takes a core; a forward split over all cores
        # would then wait at each of its barriers for a descheduled thread.
        busy = 1 if self.grammar.compiling(self._compiling) else 0
        prefill = sum(w.num_tokens for w in work if w.req.num_computed < len(w.req.prompt_ids))
        shape = [(w.num_tokens, w.req.num_computed) for w in work] if not prefill else []
        with self.threads.step(len(work), tokens, busy), self.sizer.step(len(work), tokens), \
                self.spec.timed(shape), self.pacer.step(prefill):
            logits = self.runner.forward(entries)
            self._counters["forward_passes"] += 1
            for w in work:
                w.req.num_computed += w.num_tokens - w.num_draft
                if w.num_tokens - w.num_draft > 1:
                    self.scheduler.cache_prefix(w.req)
            if reqs:
                if rows is not None:  # NOTE: staged, as a list index would sync on CUDA
                    logits = logits.index_select(0, to_device(torch.tensor(rows), logits.device))
                plan = self.spec.rows(reqs)
                out = sample(logits, plan.params, plan.rngs, self.grammar.wait(masks),
                             history=plan.history, dry=self.dry)
                for req, first in zip(reqs, plan.first):
                    self._verify(req, first, out)
        return self._collect(reqs)

    def _drafted(self, work: list[ScheduledReq], entries: list[BatchEntry]
                 ) -> tuple[list[ScheduledReq], list[BatchEntry]]:
        """The step's work once the constrained requests' drafts are checked by their
        matchers (which fill the drafts' bitmask rows): a cut draft feeds fewer tokens."""
        row = 0
        for i, w in enumerate(work):
            if not w.samples:
                continue
            req = w.req
            if w.num_draft and req.matcher is not None:
                self.grammar.check_draft(req, row)
                if len(req.draft) < w.num_draft:
                    n = w.num_tokens - w.num_draft + len(req.draft)
                    work[i] = w = ScheduledReq(req, n, len(req.draft))
                    entries[i] = self._entry(w)
            row += 1 + w.num_draft
        return work, entries

    def _verify(self, req: Req, first: int, out: SampleOutput) -> None:
        """Take ``req``'s sampled token, or walk its draft's rows (``Speculator.verify``); then
        free the KV slots of draft positions not taken (or cut by the matcher)."""
        if req.draft:
            self.spec.verify(req, first, out, self._advance)
        else:
            self._advance(req, out.token_ids[first], out.logprobs[first],
                          out.no_allowed[first], out.top[first])
        if req.status is ReqStatus.RUNNING and req.num_allocated > req.num_computed:
            self.scheduler.rewind(req, req.num_computed)

    def _advance(self, req: Req, token: int, logprob: float, dead: bool,
                 top: list[TopEntry]) -> None:
        """Append a sampled token (and the jump-forward span it unlocks) to ``req``; a failure
        on the way ends ``req`` alone, with its own error."""
        try:
            self._extend(req, token, logprob, dead, top)
        except Exception as e:  # a bug must fail this request only
            log.exception("request %s failed in its step", req.request_id)
            req.fail(ErrorKind.ENGINE_FAILURE, f"internal engine error: {type(e).__name__}: {e}")
            # NOTE: never more computed tokens than tokens (the KV goes to the prefix cache)
            self.scheduler.rewind(req, min(req.num_computed, len(req.tokens)))
        if req.error is not None:
            req.finish_reason = "error"
        if req.finish_reason is not None:
            self.scheduler.finish(req)

    def _extend(self, req: Req, token: int, logprob: float, dead: bool,
                top: list[TopEntry]) -> None:
        if req.error is not None:  # e.g. its mask could not be filled
            return
        if dead:
            self.grammar.dead_end(req)
            return
        if not self.grammar.accept(req, token):
            return
        undo = self.grammar.retraction(req)
        if req.error is not None:
            return
        if undo:  # a value check failed: the token (and those of the value) go back
            self._retract(req, undo - 1)  # NOTE: even 0 (the sampled token alone)
            return
        self._append(req, token, logprob, top)
        m = req.matcher
        if req.finish_reason is not None or m is None:
            return
        span, undo = self.grammar.forced(req)
        if undo:
            self._retract(req, undo)
        for tok in span:
            # NOTE: a forced token is the only one allowed: probability 1, alone in its top
            # list; it counts as generated for the penalties (it is in req.tokens).
            self._append(req, tok, 0.0, [(tok, 0.0)])
            req.num_forced += 1
            if req.finish_reason is not None:
                break
        if m.is_terminated() and req.finish_reason is None:
            req.finish_reason = "stop"  # e.g. ignore_eos: the grammar still ends it

    def _retract(self, req: Req, n: int) -> None:
        """Take back ``req``'s last ``n`` output tokens (``stopping.retract``); the last token
        kept is fed again to sample the next one."""
        retract(req, n)
        self.scheduler.rewind(req, len(req.tokens) - 1)

    def _append(self, req: Req, token: int, logprob: float, top: list[TopEntry]) -> None:
        append_token(req, token, logprob, eos_ids=self.eos_ids, max_model_len=self.max_model_len)
        if req.params.top_logprobs:
            req.top_logprobs.append(top)
        self._counters["generated_tokens"] += 1

    def _admit_compiled(self) -> None:
        """Queue constrained requests whose grammar is ready; fail those whose compile failed."""
        for req in [r for r in self._compiling if self.grammar.finish_compile(r)]:
            self._compiling.remove(req)
            if req.error is None:
                self.scheduler.add(req)
            else:
                req.finish_reason = "error"
                self.scheduler.finish(req)
                self._done_early.append(req)

    def _wait_for_compiles(self) -> None:
        futures = [r.grammar_future for r in self._compiling if r.grammar_future is not None]
        if futures and not self._done_early:
            wait(futures, timeout=0.01, return_when=FIRST_COMPLETED)

    def _batch(self, work: list[ScheduledReq]) -> tuple[list[ScheduledReq], list[BatchEntry]]:
        """The step's work and its batch entries, less those the runner would refuse: their
        requests fail alone (an engine bug, confined to the request), the others run."""
        kept: list[ScheduledReq] = []
        entries: list[BatchEntry] = []
        for w in work:
            entry = self._entry(w)
            problem = self.runner.entry_problem(entry)
            if problem is None:
                kept.append(w)
                entries.append(entry)
                continue
            log.error("request %s failed: %s", w.req.request_id, problem)
            w.req.fail(ErrorKind.ENGINE_FAILURE, f"internal engine error: {problem}")
            w.req.finish_reason = "error"
            self.scheduler.finish(w.req)
            self._done_early.append(w.req)
        return kept, entries

    def _entry(self, w: ScheduledReq) -> BatchEntry:
        r = w.req
        n = w.num_tokens - w.num_draft
        tokens = r.tokens[r.num_computed:r.num_computed + n]
        if w.num_draft:
            tokens += r.draft[:w.num_draft]
        return BatchEntry(r.row, r.num_computed, tokens, r.arrival, num_logits=1 + w.num_draft)

    def _collect(self, advanced: list[Req]) -> list[RequestOutput]:
        done = advanced + self._done_early
        self._done_early = []
        outs = [r.snapshot() for r in done]
        c = self._counters
        for r in done:
            if r.finished:
                del self.requests[r.request_id]
                self.spec.finish(r)
                c["finished_requests"] += 1
                c["prompt_tokens"] += len(r.prompt_ids)
                c["cached_prompt_tokens"] += r.num_cached_prompt or 0
        return outs

    def stats(self) -> EngineStats:
        """Counters since start-up and current gauges."""
        pool, s = self.runner.pool, self.scheduler
        g, cache = self.grammar.counters, self.grammar.compiler.cache_stats()
        return EngineStats(
            **self._counters, running_requests=len(s.running),
            waiting_requests=len(s.waiting) + len(self._compiling),
            kv_capacity=pool.capacity, kv_free=pool.num_free,
            kv_cached=self.cache.total_tokens if self.cache else 0,
            evicted_tokens=self.cache.evicted_tokens if self.cache else 0,
            preemptions=s.num_preemptions, running_cap=self.sizer.cap,
            prefill_cap_tokens=s.prefill_cap or 0,
            cpu_kernel_isa_level=self.loaded.kernels.isa_level,
            cpu_gemm_gops=self.loaded.kernels.gemm_gops,
            cpu_prefill_gemm_gops=self.loaded.kernels.prefill_gops,
            constrained_requests=g.constrained_requests,
            grammar_errors=g.grammar_errors, jump_forward_tokens=g.jump_forward_tokens,
            check_retries=g.check_retries, check_failures=g.check_failures,
            loop_guard_cuts=g.loop_guard_cuts,
            mask_fill_s=g.mask_fill_s, mask_wait_s=g.mask_wait_s,
            grammar_cache_hits=cache.hits + cache.shared, grammar_cache_misses=cache.misses,
            grammar_compile_s=cache.compile_s_total, grammar_cache_bytes=cache.bytes,
            **disk_fields(cache.disk), **heap_fields(heap_usage()),
            **tier_fields(self.tiers.stats() if self.tiers else None),
            spec_drafted_tokens=self.spec.counters.drafted_tokens,
            spec_accepted_tokens=self.spec.counters.accepted_tokens,
            **plan_fields(self.memory_plan), **failure_fields(FAILURES.counts()))
