"""Parser: TC source text -> ``tcdsl.core.ast.Module`` (or a tuple of ``Stmt`` for the short form).

Lark (LALR, contextual lexer, ``propagate_positions``) does the parsing; its exceptions are
translated here into located ``TcSyntaxError``s, so users never see Lark's own types.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import lark
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tcdsl.core import ast as A
from tcdsl.core.dtypes import TYPE_NAMES, canonical
from tcdsl.core.errors import SourceFile, TcSyntaxError, did_you_mean, locate

RESERVED = frozenset(("def", "where", "in", "exists", *TYPE_NAMES))
FLOAT32_MAX = 3.4028234663852886e38
MAX_INT_DIGITS = 4000  # longer integer literals are refused here (Python's int() limit is 4300 digits)
COLLAPSE = 64  # runs of more unary operators than this fold to one equivalent operator


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
        error: TcSyntaxError | None = _translate(src, e)
    else:
        error = None
    if error is not None:  # raised outside the handler: no __context__ holding lark's parser state, which
        raise error from None  # does not pickle (picklers that keep the chain, as tblib's under dask, fail)
    try:
        return _Build(src).build(tree)
    except TcSyntaxError as e:
        raise e from None


# ---- error translation -----------------------------------------------------------------------

_READABLE = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "TYPE": "a type",
    "ASSIGN": "an assignment operator (=, +=!, ...)", "LPAR": "'('", "RPAR": "')'",
    "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "QMARK": "'?'",
    "ADDOP": "'+' or '-'", "MULOP": "'*', '/' or '%'", "RELOP": "a comparison", "EQOP": "'==' or '!='",
    "OROR": "'||'", "ANDAND": "'&&'", "BANG": "'!'", "DEF": "'def'", "WHERE": "'where'", "IN": "'in'",
    "EQUIV": "'<=>'",
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
    err = _translate_at(src, e)
    unclosed = _unclosed(src, e)
    if unclosed is None or err.location is None:
        return err
    line, col, ch = unclosed
    at = err.location
    return TcSyntaxError(f"'{ch}' was never closed (the parser stopped at {at.line}:{at.col}: {err.message})",
                         locate(src, line, col, line, col + 1))


_BRACKETS = re.compile(r"#[^\n]*|//[^\n]*|[(){}]")
_CLOSER = {"(": ")", "{": "}"}


def _unclosed(src: SourceFile, e: UnexpectedInput) -> tuple[int, int, str] | None:
    """The innermost bracket still open where the parser stopped, as (line, col, bracket), when it
    explains the stop: the text ended, or a '}' came while a '(' was open."""
    tok = getattr(e, "token", None)
    at_end = isinstance(e, UnexpectedEOF) or (tok is not None and tok.type == "$END")
    pos = len(src.text) if at_end else (tok.start_pos if tok is not None else e.pos_in_stream)
    if pos is None:
        return None
    stack: list[tuple[int, str]] = []
    for m in _BRACKETS.finditer(src.text, 0, pos):
        ch = m.group(0)
        if ch in _CLOSER:
            stack.append((m.start(), ch))
        elif ch in ")}" and stack and _CLOSER[stack[-1][1]] == ch:
            stack.pop()
        elif ch in ")}":
            return None  # an unmatched closer before the stop: not an unclosed bracket
    if not stack:
        return None
    start, ch = stack[-1]
    if not (at_end or (ch == "(" and src.text.startswith("}", pos))):
        return None
    line = src.text.count("\n", 0, start) + 1
    col = start - (src.text.rfind("\n", 0, start) + 1) + 1
    return line, col, ch


def _translate_at(src: SourceFile, e: UnexpectedInput) -> TcSyntaxError:
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
        if tok.type == "NAME" and "TYPE" in e.expected:  # a misspelt type: say which there are
            msg = (f"'{tok}' is not a type; the types are {', '.join(TYPE_NAMES)}"
                   + did_you_mean(str(tok), TYPE_NAMES))
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


class _Build:
    """Lark's tree -> AST, bottom-up with an explicit stack (no recursion, so any nesting depth
    builds); each rule's method takes the rule's meta and its built children."""

    def __init__(self, src: SourceFile) -> None:
        self.src = src
        self._runs: dict[int, tuple[A.Expr, int, A.Expr, str, bool]] = {}  # id -> (node, length, base, family, odd)

    def build(self, tree: Tree) -> Any:
        self._check_names(tree)
        todo: list[tuple[Any, bool]] = [(tree, False)]
        values: list[Any] = []
        while todo:
            node, ready = todo.pop()
            if not isinstance(node, Tree):
                values.append(node)
            elif ready:
                n = len(node.children)
                items = values[len(values) - n:]
                del values[len(values) - n:]
                values.append(getattr(self, str(node.data))(node.meta, items))
            else:
                todo.append((node, True))
                todo.extend((c, False) for c in reversed(node.children))
        return values[0]

    def _check_names(self, tree: Tree) -> None:
        names: list[Token] = []
        todo = [tree]
        while todo:
            for c in todo.pop().children:
                if isinstance(c, Tree):
                    todo.append(c)
                elif isinstance(c, Token) and c.type == "NAME" and str(c) in RESERVED:
                    names.append(c)
        if names:
            tok = min(names, key=lambda t: (t.line, t.column))
            raise TcSyntaxError(f"'{tok}' is a keyword and cannot be used as a name",
                                _tok_span(self.src, tok).location())

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
            return A.Dim(value=self._int(tok), span=span)
        return A.Dim(name=str(tok), span=span)

    def stmt(self, meta, items):
        lhs, op, rhs, annotation, where = items
        name, indices = lhs
        wheres = tuple(where) if where is not None else ()
        return A.Stmt(name, indices, str(op), rhs, wheres, _span_of(self.src, meta), annotation)

    def stmt_equivalent_last(self, meta, items):
        """``lhs op rhs where ... <=> e``: the annotation written after the where clauses."""
        lhs, op, rhs, where, annotation = items
        return self.stmt(meta, [lhs, op, rhs, annotation, where])

    def equivalent(self, meta, items):
        return items[1]

    def lhs_scalar(self, meta, items):
        return (self._ident(items[0]), None)

    def lhs_indexed(self, meta, items):
        name, *idx = items
        return (self._ident(name), tuple(self._lhs_sub(t) for t in idx if t is not None))

    def _lhs_sub(self, tok: Token) -> A.Ident | A.Num:
        if tok.type == "INT":
            return A.Num(self._int(tok), False, _tok_span(self.src, tok))
        return self._ident(tok)

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
        """``-x``, ``+x``, ``!x``. A run of more than COLLAPSE operators of one family folds to one
        operator with the same value and type: ``- -x`` is ``+x`` (negation is exact in IEEE and
        in wrapping integers, and both apply the integer promotion), ``!!x`` is ``bool(x)``."""
        op, arg = items
        op = str(op)
        span = _span_of(self.src, meta)
        family = "!" if op == "!" else "+-"
        length, base, odd = 1, arg, op != "+"  # odd: an odd number of '-' (or of '!') in the run
        run = self._runs.get(id(arg))
        if run is not None and run[0] is arg and run[3] == family:
            length, base, odd = run[1] + 1, run[2], run[4] != (op != "+")
        if length <= COLLAPSE:
            node: A.Expr = A.Unary(op, arg, span)
        elif family == "!":
            node = A.Unary("!", base, span) if odd else A.Cast("bool", base, span)
        else:
            node = A.Unary("-" if odd else "+", base, span)
        self._runs[id(node)] = (node, length, base, family, odd)
        return node

    def int_lit(self, meta, items):
        return A.Num(self._int(items[0]), False, _span_of(self.src, meta))

    def _int(self, tok: Token) -> int:
        digits = str(tok).lstrip("0")
        if len(digits) > MAX_INT_DIGITS:
            raise TcSyntaxError(f"integer literal of {len(digits)} digits does not fit in any TC type (int64 holds "
                                f"19 digits)", _tok_span(self.src, tok).location())
        return int(tok)

    def float_lit(self, meta, items):
        value = float(items[0])
        if value > FLOAT32_MAX:
            text = str(items[0]) if len(items[0]) <= 40 else f"{items[0][:12]}...{items[0][-6:]}"
            raise TcSyntaxError(f"float literal {text} is out of the float32 range",
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
