"""The child process of ``ll_probe.py``: builds llguidance grammars under an address-space
bound, one at a time, and says whether each was refused.

Run as a script (it imports nothing but the standard library and ``llguidance``). Messages are
length-prefixed JSON (4 bytes, big-endian) on stdin and stdout: first the setup (``{"tokenizer",
"n_vocab", "eos", "limits"}``; answered ``{"ready": true}``), then one grammar text per message,
answered ``{"error": <llguidance's refusal, or null>}`` once its matcher is built and its first
mask computed. An allocation over the bound aborts the process, which the parent reads as
end of file.
"""

from __future__ import annotations

import json
import resource
import struct
import sys
from typing import Any, BinaryIO

import llguidance


def read_message(stream: BinaryIO) -> bytes | None:
    """One length-prefixed message, or None at end of file."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    size = struct.unpack(">I", head)[0]
    body = stream.read(size)
    return body if len(body) == size else None


def write_message(stream: BinaryIO, value: Any) -> None:
    data = json.dumps(value).encode("utf-8")
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _main() -> None:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    first = read_message(inp)
    if first is None:
        return
    setup = json.loads(first)
    tok = llguidance.LLTokenizer(setup["tokenizer"], n_vocab=setup["n_vocab"],
                                 eos_token=setup["eos"])
    limits = llguidance.LLParserLimits(**setup["limits"])
    write_message(out, {"ready": True})
    while (message := read_message(inp)) is not None:
        matcher = llguidance.LLMatcher(tok, message.decode("utf-8"), log_level=0, limits=limits)
        if not matcher.is_error():
            matcher.compute_bitmask()
        write_message(out, {"error": matcher.get_error() if matcher.is_error() else None})


if __name__ == "__main__":
    _main()
