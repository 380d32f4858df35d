"""The grammar layer: compile JSON Schema, regex, Lark/EBNF grammars, choices and tool-call
formats into per-request matchers that fill token bitmasks.

Typical use (one compiler per tokenizer; matchers per request)::

    compiler = GrammarCompiler(tokenizer)
    grammar = compiler.compile_json_schema(schema)
    matcher = grammar.matcher()
    bitmask = compiler.allocate_bitmask(batch_size)
    matcher.fill_bitmask(bitmask, row)      # then mask logits, sample
    matcher.accept_token(token_id)          # False -> matcher.is_error()
"""

from grammarserve.fsm.cache import CacheStats
from grammarserve.fsm.compiler import GrammarCompiler
from grammarserve.fsm.config import GrammarConfig, GrammarSpec
from grammarserve.fsm.matcher import CompiledGrammar, Matcher

__all__ = ["CacheStats", "CompiledGrammar", "GrammarCompiler", "GrammarConfig", "GrammarSpec",
           "Matcher"]
