"""The routing policies of :mod:`grammarserve.cluster.router` as a Ray Serve request router.

Ray Serve calls :meth:`GrammarRequestRouter.choose_replicas` in the process that holds the
deployment handle (the ingress) for each call of the engine deployment. A ``generate`` call's
arguments are ``(request_id, prompt token ids, SamplingParams, namespace)``: the policy keys on
them. Other calls (``info``) go to the least loaded replica, as Ray's default does.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from grammarserve.cluster.router import (
    RouterConfig,
    RouteRequest,
    RoutingPolicy,
    grammar_key,
    make_policy,
)
from grammarserve.sampling_params import SamplingParams


def route_request(pending: PendingRequest | None) -> RouteRequest | None:
    """The routing view of a ``generate(request_id, prompt, params, namespace)`` call; None for
    any other call."""
    if pending is None or len(pending.args) != 4:
        return None
    _, prompt, params, namespace = pending.args
    if not isinstance(params, SamplingParams) or not isinstance(prompt, list):
        return None
    return RouteRequest(str(namespace), prompt, grammar_key(params.constraint))


class GrammarRequestRouter(FIFOMixin, RequestRouter):
    """A Ray Serve ``RequestRouter`` running one of our policies (``request_router_kwargs``:
    ``policy`` and the :class:`RouterConfig` fields).

    The chosen replica is the first rank; every other replica is the second, so Ray still
    routes elsewhere when the chosen one's queue is full (``max_ongoing_requests``).
    """

    policy: RoutingPolicy

    def initialize_state(self, policy: str = "prefix_grammar", seed: int | None = None,
                         **config: Any) -> None:
        self.policy = make_policy(policy, config=RouterConfig(**config), seed=seed)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        req = route_request(pending_request)
        if req is None:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = {}
        for rid, r in by_id.items():
            queue = self._replica_queue_len_cache.get(r.replica_id)
            loads[rid] = int(queue) if queue is not None else 0
        chosen = by_id[self.policy.choose(req, sorted(by_id), loads)]
        rest = [r for r in candidate_replicas if r is not chosen]
        return [[chosen], rest] if rest else [[chosen]]
