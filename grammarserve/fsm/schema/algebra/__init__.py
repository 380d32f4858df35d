"""Schema algebra: negation, typed unions, string complements, emptiness, finiteness and
disjointness proofs."""
