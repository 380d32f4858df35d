"""Batch jobs in the OpenAI Batch API format: the offline runner behind ``grammarserve batch``
(:mod:`~grammarserve.batch.runner`) and the server's durable batch store and worker
(:mod:`~grammarserve.batch.store`, :mod:`~grammarserve.batch.worker`).

Both read input lines with :mod:`~grammarserve.batch.lines`, translate bodies with the server's own
code (:mod:`~grammarserve.batch.prepare`) and append results durably
(:mod:`~grammarserve.batch.results`): the output and error files are the record of what is done.
"""
