"""The resource bounds of the grammar layer: how deep an input may nest, what one backend step
may spend, and how refusals are remembered.

Each bound is here, explicit and configurable, rather than left to a library's default:

- Nesting (``max_depth``): checked before any parser sees the input (``schema/depth.py``).
- llguidance: its ``ParserLimits`` (Earley items per step, lexer states, grammar size, lexer
  fuel) are passed to every ``LLMatcher``; a matcher over them enters its error state (the
  request fails with a 400), never grows without bound.
- xgrammar has no such knobs. Its masks and jump-forward are bounded by the grammar: the front
  end refuses every schema and grammar with a part that can be entered but never completed
  (``schema/algebra/finite.py``, ``text_finite.py``), which is what made its jump-forward loop and allocate
  until the OOM killer came; every accepted grammar has a finite completion from
  every state, so the forced continuation is finite.
- Compile time: ``GrammarConfig.compile_timeout_s`` (``cache.py``). It fails the waiters, but a
  backend compile cannot be stopped once started, so what may start is bounded too: xgrammar
  compiles grammars of at most ``xgrammar_max_bytes`` (measured on SmolLM2's tokenizer, 2
  shared cores: an enum of 20,000 strings, 2 MB of JSON, took 93 s and +746 MB to compile
  ahead of time into a 540 MB grammar; 1,000 strings 0.9 s and +26 MB; llguidance compiled the
  20,000 in 0.3 s, +33 MB). Beyond it llguidance alone serves the grammar (``auto``).
- Size (``max_tools``, ``max_tags``, ``max_triggers``, ``max_tag_formats``,
  ``max_grammar_bytes``, ``max_grammar_rules``, ``max_regex_bytes``): checked by the front end
  before any parser or backend sees the input, each refusal a 400 naming the bound and the JSON
  path. What a backend builds from an accepted input is bounded too: llguidance refuses to
  parse a generated grammar over ``max_backend_grammar_bytes`` (a structural tag of 3,000
  triggers made a 120 MB grammar, whose parse took the engine from 7 to 23 GB until the OOM
  killer came).
- Refusals (``negative_entries``): a schema refused once is refused again from memory, without
  compiling (``cache.py``); a compile that timed out is remembered for ``negative_ttl_s`` (its
  worker may still be running it, and a timeout can be the machine's load, not the schema).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Deepest nesting accepted by default (JSON levels of a schema; parentheses of a regex or
#: grammar). The deepest of the 832 schemas of schemas/ and the JSON-Schema-Test-Suite nests 22
#: levels, and OpenAI's strict mode allows 10 levels of objects (about 20 JSON levels), so 64 is
#: about 3x what real schemas need; it keeps every accepted schema, after the front end's
#: rewrites and the tool-call wrapping, under llguidance's JSON parser limit (128 levels), and
#: the recursive Python walkers (jsonschema, the rewrites) far from Python's recursion limit.
DEFAULT_MAX_DEPTH = 64


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on what one grammar may cost (see the module docstring).

    Attributes
    ----------
    max_depth : int
        Deepest nesting of a JSON schema (JSON levels: ``{"a": {}}`` is 2) and of parentheses
        in a regex, Lark or EBNF grammar (a schema's ``pattern`` included).
    step_max_items : int
        llguidance: Earley items one mask or jump-forward step may create (~20k per ms).
    max_items_in_row : int
        llguidance: branching of one grammar row.
    max_lexer_states : int
        llguidance: lexer states one grammar may build (each ~1-2 kB).
    max_grammar_size : int
        llguidance: symbols of a grammar's productions.
    xgrammar_max_bytes : int
        Largest grammar source (a schema's canonical JSON, a grammar's text) xgrammar
        compiles; 128 KiB is 2.3x the largest schema of schemas/realworld/ (55 KB).
    initial_lexer_fuel, step_lexer_fuel : int
        llguidance: lexer work to build a grammar's regexes, and per mask step.
    negative_entries : int
        Refused inputs remembered (LRU; 0 keeps none).
    memo_bytes : int
        Bytes of inputs the front-end memo and the negative cache may each hold (their keys
        are the inputs, as large as a request body).
    negative_ttl_s : float
        How long a compile timeout is remembered (refusals of the input itself stay until
        evicted).
    max_tools : int
        Function tools of one request (OpenAI allows 128).
    max_tags : int
        Tags of one structural tag (``structures`` of the legacy shape, ``tags`` of every
        ``triggered_tags`` and ``tags_with_separator``, together). At 2,048 tags one trigger's
        alternatives passed llguidance's ``max_items_in_row``.
    max_triggers : int
        Triggers of one structural tag (``triggers`` and ``dispatch`` patterns, together). Each
        trigger's free text excludes every other, so the lexer's work grows with the square:
        at 96 triggers llguidance's lexer gave up on the first tag ("too many expressions"),
        at 64 it served it.
    max_tag_formats : int
        Format objects of one structural tag (each one is a grammar rule).
    max_grammar_bytes : int
        Length of a Lark or EBNF grammar's text (UTF-8 bytes).
    max_grammar_rules : int
        Rules and terminals one Lark or EBNF grammar defines (the ``lark`` check's cost grows
        with them: 0.3 s for 1,500 chained rules; its Earley construction took 7 s).
    max_regex_bytes : int
        Length of a regex (UTF-8 bytes).
    max_backend_grammar_bytes : int
        Largest grammar text the grammar layer hands to llguidance's parser (the grammar it
        generates for a tool-call format or a structural tag, embedded schemas included).
        Measured with SmolLM2's tokenizer: 0.5 MB (256 tools of 20 properties) compiled in
        1.9 s, +140 MB; 2 MB (512 tools of 40) took 7 s and +460 MB before llguidance refused
        it (over its 65,535 grammar symbols).
    probe_bytes, probe_memory_bytes : int
        An llguidance grammar over ``probe_bytes`` is built first in a child process, under
        ``probe_memory_bytes`` of address space and killed at the compile timeout
        (``backends/ll_probe.py``).
    check_timeout_s, check_memory_bytes : float, int
        Time and address space of the child process that checks a large Lark grammar
        (``text_grammars.check_lark``); it is killed at the deadline.
    """

    max_depth: int = DEFAULT_MAX_DEPTH
    step_max_items: int = 50_000
    max_items_in_row: int = 2_000
    max_lexer_states: int = 250_000
    max_grammar_size: int = 500_000
    xgrammar_max_bytes: int = 128 * 1024
    initial_lexer_fuel: int = 1_000_000
    step_lexer_fuel: int = 200_000
    negative_entries: int = 4096
    memo_bytes: int = 64 * 2**20
    negative_ttl_s: float = 600.0
    max_tools: int = 512
    max_tags: int = 512
    max_triggers: int = 64
    max_tag_formats: int = 10_000
    max_grammar_bytes: int = 64 * 1024
    max_grammar_rules: int = 1_000
    max_regex_bytes: int = 32 * 1024
    max_backend_grammar_bytes: int = 2**20
    probe_bytes: int = 64 * 1024
    probe_memory_bytes: int = 2 * 2**30
    check_timeout_s: float = 10.0
    check_memory_bytes: int = 2**30

    def __post_init__(self) -> None:
        for name in ("max_depth", "step_max_items", "max_items_in_row", "max_lexer_states",
                     "max_grammar_size", "initial_lexer_fuel", "step_lexer_fuel",
                     "xgrammar_max_bytes", "max_tools", "max_tags", "max_triggers",
                     "max_tag_formats", "max_grammar_bytes", "max_grammar_rules",
                     "max_regex_bytes", "max_backend_grammar_bytes", "check_memory_bytes",
                     "probe_bytes", "probe_memory_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.memo_bytes < 0:
            raise ValueError(f"memo_bytes must be >= 0, got {self.memo_bytes}")
        if self.negative_entries < 0:
            raise ValueError(f"negative_entries must be >= 0, got {self.negative_entries}")
        if self.check_timeout_s <= 0:
            raise ValueError(f"check_timeout_s must be > 0, got {self.check_timeout_s}")
        if self.negative_ttl_s < 0:
            raise ValueError(f"negative_ttl_s must be >= 0, got {self.negative_ttl_s}")
