"""Parser: TC source text -> ``tcdsl.ast.Module`` (or a tuple of ``Stmt`` for the short form).

Lark (LALR, contextual lexer, ``propagate_positions``) does the parsing; its exceptions are
translated here into located ``TcSyntaxError``s, so users never see Lark's own types.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import lark
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from tcdsl import ast as A
from tcdsl.dtypes import TYPE_NAMES, canonical
from tcdsl.errors import SourceFile, TcError, TcSyntaxError, locate

RESERVED = frozenset(("def", "where", "in", "exists", *TYPE_NAMES))
FLOAT32_MAX = 3.4028234663852886e38


@functools.cache
def _lark() -> Lark:
    text = resources.files(__package__).joinpath("tc.lark").read_text(encoding="utf-8")
    return Lark(text, parser="lalr", lexer="contextual", start=["module", "stmts"],
                propagate_positions=True, maybe_placeholders=True)


def parse(text: str, filename: str = "<string>") -> A.Module:
    """Parse a source holding one or more defs."""
    src = SourceFile(filename, text)
    return _run(src, "module")


def parse_statements(text: str, filename: str = "<string>") -> tuple[A.Stmt, ...]:
    """Parse the short form: statements without a ``def`` header."""
    src = SourceFile(filename, text)
    return _run(src, "stmts")


def is_short_form(text: str) -> bool:
    """True when the text holds statements only (no ``def`` header)."""
    stripped = re.sub(r"(#|//)[^\n]*", "", text).lstrip()
    return not re.match(r"def(?![A-Za-z0-9_])", stripped)


def _run(src: SourceFile, start: str) -> Any:
    try:
        tree = _lark().parse(src.text, start=start)
    except UnexpectedInput as e:
        raise _translate(src, e) from None
    names = sorted(tree.scan_values(lambda v: isinstance(v, Token) and v.type == "NAME"),
                   key=lambda t: (t.line, t.column))
    for tok in names:
        if str(tok) in RESERVED:
            raise TcSyntaxError(f"'{tok}' is a keyword and cannot be used as a name",
                                _tok_span(src, tok).location()) from None
    try:
        return _Build(src).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, TcError):
            raise e.orig_exc from None
        raise


# ---- error translation -----------------------------------------------------------------------

_READABLE = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "TYPE": "a type",
    "ASSIGN": "an assignment operator (=, +=!, ...)", "LPAR": "'('", "RPAR": "')'",
    "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "QMARK": "'?'",
    "ADDOP": "'+' or '-'", "MULOP": "'*', '/' or '%'", "RELOP": "a comparison", "EQOP": "'==' or '!='",
    "OROR": "'||'", "ANDAND": "'&&'", "BANG": "'!'", "DEF": "'def'", "WHERE": "'where'", "IN": "'in'",
    "EXISTS": "'exists'", "__ANON_0": "'->'", "MINUS": "'-'", "MORETHAN": "'>'", "$END": "the end of the text",
}


def _readable(name: str) -> str:
    if name in _READABLE:
        return _READABLE[name]
    try:
        pattern = _lark().get_terminal(name).pattern.value
        return f"'{pattern}'"
    except (KeyError, AttributeError):
        return name.lower()


def _expected(names: set[str] | frozenset[str]) -> str:
    words = sorted({_readable(n) for n in names})
    if not words:
        return ""
    if len(words) > 6:
        words = words[:6] + ["..."]
    return "; expected " + ", ".join(words)


def _token_text(tok: Token) -> str:
    return "the end of the text" if tok.type == "$END" else repr(str(tok))


def _translate(src: SourceFile, e: UnexpectedInput) -> TcSyntaxError:
    if isinstance(e, UnexpectedCharacters):
        pos = e.pos_in_stream or 0
        ch = src.text[pos] if pos < len(src.text) else "?"
        msg = f"unexpected character {ch!r}"
        return TcSyntaxError(msg, locate(src, e.line, e.column, e.line, e.column + 1))
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            line, col = _end_position(src)
            return TcSyntaxError("unexpected end of text" + _expected(e.expected), locate(src, line, col))
        msg = f"unexpected {_token_text(tok)}" + _expected(e.expected)
        end = (tok.end_column or tok.column + len(str(tok)))
        return TcSyntaxError(msg, locate(src, tok.line, tok.column, tok.end_line, end))
    if isinstance(e, UnexpectedEOF):
        line, col = _end_position(src)
        return TcSyntaxError("unexpected end of text" + _expected(set(e.expected)), locate(src, line, col))
    return TcSyntaxError(str(e))


def _end_position(src: SourceFile) -> tuple[int, int]:
    """Just after the last token (comments and trailing blanks skipped)."""
    code = re.sub(r"(#|//)[^\n]*", lambda m: " " * len(m.group(0)), src.text)
    lines = code.rstrip().splitlines() or [""]
    return len(lines), len(lines[-1].rstrip()) + 1


# ---- tree -> AST -------------------------------------------------------------------------------


def _span_of(src: SourceFile, meta: Any) -> A.Span:
    if getattr(meta, "empty", False) or not hasattr(meta, "line"):
        return A.Span(src, 0, 0, 0, 0)
    return A.Span(src, meta.line, meta.column, meta.end_line, meta.end_column)


def _tok_span(src: SourceFile, tok: Token) -> A.Span:
    return A.Span(src, tok.line or 0, tok.column or 0, tok.end_line or 0, tok.end_column or 0)


@v_args(meta=True)
class _Build(Transformer):
    def __init__(self, src: SourceFile) -> None:
        super().__init__()
        self.src = src

    def _ident(self, tok: Token) -> A.Ident:
        return A.Ident(str(tok), _tok_span(self.src, tok))

    def module(self, meta, defs):
        return A.Module(tuple(defs), self.src)

    def stmts(self, meta, items):
        return tuple(items)

    def def_(self, meta, items):
        name, *rest = items
        params = tuple(p for p in rest if isinstance(p, A.Param))
        outputs = tuple(o for o in rest if isinstance(o, A.Output))
        stmts = tuple(s for s in rest if isinstance(s, A.Stmt))
        return A.Def(self._ident(name), params, outputs, stmts, _span_of(self.src, meta))

    def tensor_param(self, meta, items):
        typ, *dims, name = items
        return A.Param(canonical(str(typ)), self._ident(name), tuple(d for d in dims if d is not None),
                       _span_of(self.src, meta))

    def scalar_param(self, meta, items):
        typ, name = items
        return A.Param(canonical(str(typ)), self._ident(name), None, _span_of(self.src, meta))

    def untyped_output(self, meta, items):
        return A.Output(self._ident(items[0]), None, None, _span_of(self.src, meta))

    def typed_output(self, meta, items):
        typ, *dims, name = items
        return A.Output(self._ident(name), canonical(str(typ)), tuple(d for d in dims if d is not None),
                        _span_of(self.src, meta))

    def scalar_output(self, meta, items):
        typ, name = items
        return A.Output(self._ident(name), canonical(str(typ)), (), _span_of(self.src, meta))

    def dim(self, meta, items):
        tok = items[0]
        span = _tok_span(self.src, tok)
        if tok.type == "FLOAT":
            raise TcSyntaxError(f"unexpected '{tok}': a dim is a size symbol or an integer", span.location())
        if tok.type == "INT":
            return A.Dim(value=int(tok), span=span)
        return A.Dim(name=str(tok), span=span)

    def stmt(self, meta, items):
        lhs, op, rhs, where = items
        name, indices = lhs
        wheres = tuple(where) if where is not None else ()
        return A.Stmt(name, indices, str(op), rhs, wheres, _span_of(self.src, meta))

    def lhs_scalar(self, meta, items):
        return (self._ident(items[0]), None)

    def lhs_indexed(self, meta, items):
        name, *idx = items
        return (self._ident(name), tuple(self._ident(t) for t in idx if t is not None))

    def where_clause(self, meta, items):
        return items

    def where_range(self, meta, items):
        name, lo, hi = items
        return A.WhereRange(self._ident(name), lo, hi, _span_of(self.src, meta))

    def where_exists(self, meta, items):
        name, *args = items
        span = _span_of(self.src, meta)
        access = A.Apply(str(name), tuple(a for a in args if a is not None), span)
        return A.WhereExists(access, span)

    def where_let(self, meta, items):
        name, op, value = items
        if str(op) != "=":
            raise TcSyntaxError(f"a where-let is written `{name} = expr`, not with {str(op)!r}",
                                _tok_span(self.src, op).location())
        return A.WhereLet(self._ident(name), value, _span_of(self.src, meta))

    def ternary(self, meta, items):
        c, a, b = items
        return A.Ternary(c, a, b, _span_of(self.src, meta))

    def binary(self, meta, items):
        lhs, op, rhs = items
        return A.Binary(str(op), lhs, rhs, _span_of(self.src, meta))

    def unary(self, meta, items):
        op, arg = items
        return A.Unary(str(op), arg, _span_of(self.src, meta))

    def int_lit(self, meta, items):
        return A.Num(int(items[0]), False, _span_of(self.src, meta))

    def float_lit(self, meta, items):
        value = float(items[0])
        if value > FLOAT32_MAX:
            raise TcSyntaxError(f"float literal {items[0]} is out of the float32 range",
                                _tok_span(self.src, items[0]).location())
        return A.Num(value, True, _span_of(self.src, meta))

    def name(self, meta, items):
        return A.Name(str(items[0]), _span_of(self.src, meta))

    def apply(self, meta, items):
        name, *args = items
        return A.Apply(str(name), tuple(a for a in args if a is not None), _span_of(self.src, meta))

    def cast(self, meta, items):
        typ, arg = items
        return A.Cast(canonical(str(typ)), arg, _span_of(self.src, meta))


__all__ = ["parse", "parse_statements", "is_short_form", "lark"]
