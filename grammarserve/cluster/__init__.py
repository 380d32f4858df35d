"""Beyond one machine: engine replicas on Ray (the optional extra ``grammarserve[ray]``).

- :mod:`~grammarserve.cluster.router`: which replica serves a request (prefix- and grammar-aware
  rendezvous hashing bounded by load, plus round-robin and power-of-two for comparison); pure
  Python, no Ray.
- :mod:`~grammarserve.cluster.serve`: the Ray Serve application (the OpenAI routes as the
  ingress, N engine replicas behind the router).
- :mod:`~grammarserve.cluster.data`: batch files on Ray Data (an actor pool of engines).

Only the Ray entry points import Ray; importing this package does not.
"""

from grammarserve.errors import GrammarserveError


def require_ray() -> None:
    """Raise a one-line error naming the extra to install when Ray is missing."""
    try:
        import ray
        import ray.data
        import ray.serve  # noqa: F401
    except ImportError as e:
        raise GrammarserveError(f"--ray needs Ray ({e}); install it with: pip install "
                                "'grammarserve[ray]'") from None
