"""Beyond one machine: engine replicas on Ray (the optional extra ``grammarserve[ray]``).

- :mod:`~grammarserve.cluster.router`: which replica serves a request (prefix- and grammar-aware
  rendezvous hashing bounded by load, plus round-robin and power-of-two for comparison); pure
  Python, no Ray.
- :mod:`~grammarserve.cluster.serve`: the Ray Serve application (the OpenAI routes as the
  ingress, N engine replicas behind the router).
- :mod:`~grammarserve.cluster.data`: batch files on Ray Data (an actor pool of engines).

Only the Ray entry points import Ray; importing this package does not.
"""
