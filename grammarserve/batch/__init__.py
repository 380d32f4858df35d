"""Batch jobs in the OpenAI Batch API format: the offline runner behind ``grammarserve batch``
(:mod:`~grammarserve.batch.runner`) and the server's durable batch store and worker
(:mod:`~grammarserve.batch.store`, :mod:`~grammarserve.batch.worker`).

Both read input lines with :mod:`~grammarserve.batch.lines`, prepare and answer them with the
protocol layer (:mod:`grammarserve.openai`, as the HTTP server does, so a line gets the status and
body the server would give) and append results durably (:mod:`~grammarserve.batch.results`): the
output and error files are the record of what is done. Nothing here imports the server.
"""
