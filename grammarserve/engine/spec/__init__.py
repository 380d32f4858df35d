"""Speculative decoding: drafts from the request's own tokens and from earlier replies of its
namespace, checked by the matcher, verified in the step's one forward (``speculator.py``)."""
