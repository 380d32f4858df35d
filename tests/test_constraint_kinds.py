"""One vocabulary of constraint kinds (``grammarserve.constraints``): a :class:`Constraint`
carries a :class:`ConstraintKind` (and a grammar its :class:`GrammarSyntax`), the grammar
layer's spec kind is one of them, and the strings they stand for are unchanged (the compiler's
arguments, the cache and routing keys)."""

from __future__ import annotations

import json

import pytest

from grammarserve.constraints import Constraint, ConstraintKind, GrammarSyntax
from grammarserve.fsm.config import GrammarConfig
from grammarserve.fsm.frontend import SpecBuilder

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(("constraint", "kind"), [
    (Constraint.json_schema(SCHEMA), ConstraintKind.JSON_SCHEMA),
    (Constraint.json_object(), ConstraintKind.JSON_SCHEMA),
    (Constraint.regex("a+"), ConstraintKind.REGEX),
    (Constraint.grammar('start: "a"'), ConstraintKind.GRAMMAR),
    (Constraint.choice(["x", "y"]), ConstraintKind.CHOICE),
    (Constraint.tool_calls([]), ConstraintKind.TOOL_CALLS),
    (Constraint.structural_tag({"format": {"type": "any_text"}}), ConstraintKind.STRUCTURAL_TAG),
])
def test_the_constructors_carry_the_enum(constraint: Constraint, kind: ConstraintKind) -> None:
    assert constraint.kind is kind and constraint.compile_args()[0] is kind
    assert constraint.kind == kind.value and str(kind) == f"{kind}" == kind.value


def test_the_compiler_arguments_keep_their_strings() -> None:
    ebnf = Constraint.grammar('root ::= "a"', "ebnf")
    assert ebnf.syntax is GrammarSyntax.EBNF and ebnf.syntax == "ebnf"
    assert json.dumps(ebnf.compile_args()) == json.dumps(  # the routing key, as before
        ["grammar", ['root ::= "a"'], {"syntax": "ebnf"}])
    assert Constraint.grammar("x").syntax is GrammarSyntax.LARK
    assert Constraint.grammar("x", GrammarSyntax.EBNF) == Constraint.grammar("x", "ebnf")


def test_kinds_are_not_strings() -> None:
    with pytest.raises(TypeError, match="ConstraintKind"):
        Constraint("regex", "a+")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GrammarSyntax"):
        Constraint(ConstraintKind.GRAMMAR, "x", syntax="lark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grammar syntax must be 'lark' or 'ebnf', got 'yaml'"):
        Constraint.grammar("x", "yaml")


def test_a_spec_kind_is_the_constraint_kind_or_the_syntax() -> None:
    front = SpecBuilder(GrammarConfig())
    for constraint, kind in ((Constraint.regex("a+"), ConstraintKind.REGEX),
                             (Constraint.grammar('start: "a"'), GrammarSyntax.LARK),
                             (Constraint.grammar('root ::= "a"', "ebnf"), GrammarSyntax.EBNF),
                             (Constraint.json_schema(SCHEMA), ConstraintKind.JSON_SCHEMA)):
        name, args, kwargs = constraint.compile_args()
        spec = front.spec(name, *args, **kwargs)
        assert spec.kind is kind
        assert json.loads(spec.key("f", "b"))[0] == kind.value  # the cache key as before
        assert front.spec(name.value, *args, **kwargs) == spec  # the compiler's strings too


def test_prepared_must_be_the_grammar_layers_spec() -> None:
    from tiny_models import eos_byte_tokenizer

    from grammarserve.fsm import GrammarCompiler

    compiler = GrammarCompiler(eos_byte_tokenizer())
    kind, args, kwargs = Constraint.regex("ab").compile_args()
    spec = compiler.spec(kind, *args, **kwargs)
    assert compiler.compile_prepared_async(spec).result().kind is ConstraintKind.REGEX
    with pytest.raises(TypeError, match="must be a GrammarSpec made by GrammarCompiler.spec"):
        compiler.compile_prepared_async(object()).result()  # type: ignore[arg-type]
