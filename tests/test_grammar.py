"""Grammar, parser and canonical printer: AST shapes for every construct, located syntax errors,
printer round trips (examples, hand-written defs, hypothesis-generated expressions)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerance import assert_close, assert_sum_close

import tcdsl
from tcdsl.core import ast as A
from tcdsl.core import printer
from tcdsl.errors import Location, TcError, TcSyntaxError
from tcdsl.grammar import is_short_form, parse, parse_statements

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.tc"))


# ---- helpers: spans are excluded from equality, so hand-built nodes compare with parsed ones ----


def n(name: str) -> A.Name:
    return A.Name(name)


def i(value: int) -> A.Num:
    return A.Num(value, False)


def f(value: float) -> A.Num:
    return A.Num(value, True)


def b(op: str, lhs: A.Expr, rhs: A.Expr) -> A.Binary:
    return A.Binary(op, lhs, rhs)


def u(op: str, arg: A.Expr) -> A.Unary:
    return A.Unary(op, arg)


def t(c: A.Expr, x: A.Expr, y: A.Expr) -> A.Ternary:
    return A.Ternary(c, x, y)


def app(name: str, *args: A.Expr) -> A.Apply:
    return A.Apply(name, tuple(args))


def ident(name: str) -> A.Ident:
    return A.Ident(name)


def rhs(text: str) -> A.Expr:
    """The right-hand side of a one-statement short form `X = text`."""
    (s,) = parse_statements(f"X = {text}")
    return s.rhs


def one_def(text: str) -> A.Def:
    m = parse(text)
    assert len(m.defs) == 1
    return m.defs[0]


# ---- (a) AST shapes --------------------------------------------------------------------------

TYPES = [
    ("bool", "bool"),
    ("int8", "int8"), ("int16", "int16"), ("int32", "int32"), ("int64", "int64"),
    ("uint8", "uint8"), ("uint16", "uint16"), ("uint32", "uint32"), ("uint64", "uint64"),
    ("float16", "float16"), ("float32", "float32"), ("float", "float32"),
    ("float64", "float64"), ("double", "float64"),
]


@pytest.mark.parametrize("spelled,canon", TYPES)
def test_every_type_name(spelled: str, canon: str) -> None:
    d = one_def(f"def f({spelled}(N, 4) A, {spelled} s) -> ({spelled}(N) B, {spelled} S, C) {{\n"
                f"  B(i) = {spelled}(A(i, 0)) + s\n"
                f"  S +=! A(r_i, 0)\n"
                f"  C(i) = B(i)\n"
                f"}}")
    assert d.params == (A.Param(canon, ident("A"), (A.Dim(name="N"), A.Dim(value=4))),
                        A.Param(canon, ident("s"), None))
    assert d.outputs == (A.Output(ident("B"), canon, (A.Dim(name="N"),)),
                         A.Output(ident("S"), canon, ()),
                         A.Output(ident("C"), None, None))
    assert d.stmts[0].rhs == b("+", A.Cast(canon, app("A", n("i"), i(0))), n("s"))
    # canonical spelling in the printer
    assert printer.param(d.params[0]) == f"{canon}(N, 4) A"
    assert printer.param(d.params[1]) == f"{canon} s"
    assert printer.output(d.outputs[1]) == f"{canon} S"
    assert printer.expr(d.stmts[0].rhs) == f"{canon}(A(i, 0)) + s"


def test_names_that_start_with_a_type_name_are_names() -> None:
    d = one_def("def f(float(N) floaty, int8(N) int8_t) -> (doubled, bool_) {\n"
                "  doubled(i) = floaty(i) * int(int8_t(i)) + uint(3) + float32x\n"
                "  bool_(i) = doubled(i)\n"
                "}")
    assert [p.name.name for p in d.params] == ["floaty", "int8_t"]
    assert [o.name.name for o in d.outputs] == ["doubled", "bool_"]
    # `int` and `uint` are no TC types: they parse as calls, sema decides what they mean
    assert d.stmts[0].rhs == b("+", b("+", b("*", app("floaty", n("i")), app("int", app("int8_t", n("i")))),
                                         app("uint", i(3))), n("float32x"))


def test_def_header_shapes() -> None:
    d = one_def("def conv(float(N, C, H, W) I, float(F, C, 3, 3) W1, int32 k, double(7) V) -> "
                "(O, float(N, F) P, int64 Q) {\n  O(n) = 1\n}")
    assert d.name == ident("conv")
    assert d.params[1].dims == (A.Dim(name="F"), A.Dim(name="C"), A.Dim(value=3), A.Dim(value=3))
    assert d.params[2] == A.Param("int32", ident("k"), None)
    assert d.params[3] == A.Param("float64", ident("V"), (A.Dim(value=7),))
    assert d.outputs == (A.Output(ident("O")),
                         A.Output(ident("P"), "float32", (A.Dim(name="N"), A.Dim(name="F"))),
                         A.Output(ident("Q"), "int64", ()))


def test_empty_param_and_output_lists_and_empty_body() -> None:
    d = one_def("def nothing() -> () {\n}")
    assert (d.name.name, d.params, d.outputs, d.stmts) == ("nothing", (), (), ())


def test_several_defs_per_source() -> None:
    m = parse("def a(float(N) X) -> (Y) { Y(i) = X(i) }\n"
              "# between the defs\n"
              "def b(float(N) X) -> (Y) { Y(i) = -X(i) }\n"
              "def c(float X) -> (Y) { Y = X }\n")
    assert [d.name.name for d in m.defs] == ["a", "b", "c"]
    assert m.defs[1].stmts[0].rhs == u("-", app("X", n("i")))
    assert m.defs[2].stmts[0] == A.Stmt(ident("Y"), None, "=", n("X"))


@pytest.mark.parametrize("op", ["=", "+=", "*=", "min=", "max=", "+=!", "*=!", "min=!", "max=!"])
def test_every_statement_operator(op: str) -> None:
    (s,) = parse_statements(f"C(i, j) {op} A(i, r_k) * B(r_k, j)")
    assert s == A.Stmt(ident("C"), (ident("i"), ident("j")), op,
                       b("*", app("A", n("i"), n("r_k")), app("B", n("r_k"), n("j"))))
    assert s.init == op.endswith("!")
    assert s.reduction == {"=": None, "+=": "+", "*=": "*", "min=": "min", "max=": "max"}[op.rstrip("!")]
    assert printer.stmt(s) == f"C(i, j) {op} A(i, r_k) * B(r_k, j)"


def test_operators_without_spaces() -> None:
    (s1, s2, s3) = parse_statements("C(i)+=!A(i)\nD(i)max=!-A(i)\nE(i)min=A(i)")
    assert (s1.op, s2.op, s3.op) == ("+=!", "max=!", "min=")
    assert s2.rhs == u("-", app("A", n("i")))


def test_where_clauses() -> None:
    (s,) = parse_statements("O(n, h) +=! I(n, h + r_k - 1) * x\n"
                            "    where h in 0:H, r_k in 0:2 * K + 1, exists I(n, 0), x = W(r_k) * 2.0,\n"
                            "          n in N - 1:N")
    assert s.wheres == (
        A.WhereRange(ident("h"), i(0), n("H")),
        A.WhereRange(ident("r_k"), i(0), b("+", b("*", i(2), n("K")), i(1))),
        A.WhereExists(app("I", n("n"), i(0))),
        A.WhereLet(ident("x"), b("*", app("W", n("r_k")), f(2.0))),
        A.WhereRange(ident("n"), b("-", n("N"), i(1)), n("N")),
    )
    assert s.rhs == b("*", app("I", n("n"), b("-", b("+", n("h"), n("r_k")), i(1))), n("x"))


def test_where_range_bounds_are_full_or_expressions() -> None:
    (s,) = parse_statements("O(i) = A(i) where i in a || b:c && d")
    assert s.wheres == (A.WhereRange(ident("i"), b("||", n("a"), n("b")), b("&&", n("c"), n("d"))),)


def test_where_let_holds_a_ternary() -> None:
    (s,) = parse_statements("O(i) = y where y = A(i) > 0 ? A(i) : 0.0")
    assert s.wheres == (A.WhereLet(ident("y"), t(b(">", app("A", n("i")), i(0)), app("A", n("i")), f(0.0))),)


PRECEDENCE = [
    ("a + b * c", b("+", n("a"), b("*", n("b"), n("c")))),
    ("a * b + c", b("+", b("*", n("a"), n("b")), n("c"))),
    ("a - b - c", b("-", b("-", n("a"), n("b")), n("c"))),
    ("a / b % c * d", b("*", b("%", b("/", n("a"), n("b")), n("c")), n("d"))),
    ("a || b && c", b("||", n("a"), b("&&", n("b"), n("c")))),
    ("a && b || c && d", b("||", b("&&", n("a"), n("b")), b("&&", n("c"), n("d")))),
    ("a || b || c", b("||", b("||", n("a"), n("b")), n("c"))),
    ("!a == b", b("==", u("!", n("a")), n("b"))),
    ("-a * b", b("*", u("-", n("a")), n("b"))),
    ("a * -b", b("*", n("a"), u("-", n("b")))),
    ("+a - -b", b("-", u("+", n("a")), u("-", n("b")))),
    ("- -a", u("-", u("-", n("a")))),
    ("!!a", u("!", u("!", n("a")))),
    ("-!a", u("-", u("!", n("a")))),
    ("-(a + b)", u("-", b("+", n("a"), n("b")))),
    ("(a + b) * c", b("*", b("+", n("a"), n("b")), n("c"))),
    ("a ? b : c ? d : e", t(n("a"), n("b"), t(n("c"), n("d"), n("e")))),
    ("a ? b ? c : d : e", t(n("a"), t(n("b"), n("c"), n("d")), n("e"))),
    ("(a ? b : c) ? d : e", t(t(n("a"), n("b"), n("c")), n("d"), n("e"))),
    ("a || b ? c + 1 : d * 2", t(b("||", n("a"), n("b")), b("+", n("c"), i(1)), b("*", n("d"), i(2)))),
    ("a < b == c > d", b("==", b("<", n("a"), n("b")), b(">", n("c"), n("d")))),
    ("a + b < c * d", b("<", b("+", n("a"), n("b")), b("*", n("c"), n("d")))),
    ("a == b != c", b("!=", b("==", n("a"), n("b")), n("c"))),
    ("a <= b >= c", b(">=", b("<=", n("a"), n("b")), n("c"))),
    ("a < b && c >= d || !e", b("||", b("&&", b("<", n("a"), n("b")), b(">=", n("c"), n("d"))), u("!", n("e")))),
    ("a - 1", b("-", n("a"), i(1))),
    ("-1", u("-", i(1))),
    ("f(a, b + c, g())", app("f", n("a"), b("+", n("b"), n("c")), app("g"))),
    ("max(A(i, j), 0.0) * exp(-x)", b("*", app("max", app("A", n("i"), n("j")), f(0.0)), app("exp", u("-", n("x"))))),
    ("T(Idx(b, r_l), d)", app("T", app("Idx", n("b"), n("r_l")), n("d"))),
    ("float(i) / double(N)", b("/", A.Cast("float32", n("i")), A.Cast("float64", n("N")))),
    ("int32(x + 0.5)", A.Cast("int32", b("+", n("x"), f(0.5)))),
    ("((a))", n("a")),
]


@pytest.mark.parametrize("text,expected", PRECEDENCE, ids=[p[0] for p in PRECEDENCE])
def test_precedence_and_associativity(text: str, expected: A.Expr) -> None:
    assert rhs(text) == expected


@pytest.mark.parametrize("text,value,is_float", [
    ("0", 0, False), ("7", 7, False), ("123456789012", 123456789012, False),
    ("1.", 1.0, True), ("1.5", 1.5, True), (".5", 0.5, True), ("1e3", 1000.0, True),
    ("1.5E-2", 0.015, True), ("2e+3", 2000.0, True), ("0.0", 0.0, True), ("3.4e38", 3.4e38, True),
])
def test_number_literals(text: str, value: float, is_float: bool) -> None:
    e = rhs(text)
    assert isinstance(e, A.Num)
    assert e.value == value and type(e.value) is (float if is_float else int) and e.is_float is is_float


def test_comments_everywhere() -> None:
    src = ("# leading comment\n"
           "// another style\n"
           "def f(float(N) A, # after a param\n"
           "      float(N) B) // after the params\n"
           "  -> (C) { # after the brace\n"
           "  C(i) = A(i) + # in the middle of an expression\n"
           "         B(i) // and after it\n"
           "  # a comment line in the body\n"
           "}\n"
           "# a last comment without newline")
    d = one_def(src)
    assert d.stmts == (A.Stmt(ident("C"), (ident("i"),), "=", b("+", app("A", n("i")), app("B", n("i")))),)


def test_statements_split_across_lines_anywhere() -> None:
    src = ("def f(float(N,\n K) A,\n float(K) B) -> (\nC) {\n"
           "  C(\n  i\n  )\n  +=!\n  A(i,\n r_k) *\n B(\n r_k)\n"
           "  where\n r_k\n in\n 0\n:\n K\n"
           "  D(i) = C(i) > 0\n ?\n C(i)\n :\n -C(i) D2(i) = D(i)\n"
           "}")
    d = one_def(src)
    assert d.params[0].dims == (A.Dim(name="N"), A.Dim(name="K"))
    assert d.outputs == (A.Output(ident("C")),)
    assert d.stmts == (
        A.Stmt(ident("C"), (ident("i"),), "+=!", b("*", app("A", n("i"), n("r_k")), app("B", n("r_k"))),
               (A.WhereRange(ident("r_k"), i(0), n("K")),)),
        A.Stmt(ident("D"), (ident("i"),), "=", t(b(">", app("C", n("i")), i(0)), app("C", n("i")),
                                                 u("-", app("C", n("i"))))),
        A.Stmt(ident("D2"), (ident("i"),), "=", app("D", n("i"))),
    )
    # spans: the first statement runs from line 5 to line 18
    s0 = d.stmts[0]
    assert (s0.span.line, s0.span.col) == (5, 3)
    assert s0.span.end_line == 18
    assert (s0.lhs.span.line, s0.lhs.span.col) == (5, 3)
    assert s0.indices is not None
    assert (s0.indices[0].span.line, s0.indices[0].span.col) == (6, 3)


def test_crlf_line_endings() -> None:
    lf = "def f(float(N) A) -> (C) {\n  C(i) = A(i)\n    * 2\n}\n"
    m_lf, m_crlf = parse(lf), parse(lf.replace("\n", "\r\n"))
    assert m_lf == m_crlf
    s = m_crlf.defs[0].stmts[0]
    assert (s.span.line, s.span.col, s.span.end_line) == (2, 3, 3)


def test_rank0_lhs_and_reads() -> None:
    d = one_def("def total(float(N) A, float alpha) -> (S, float T) {\n"
                "  S +=! A(r_i) * alpha\n"
                "  T = S / float(N)\n"
                "}")
    assert d.stmts[0] == A.Stmt(ident("S"), None, "+=!", b("*", app("A", n("r_i")), n("alpha")))
    assert d.stmts[1] == A.Stmt(ident("T"), None, "=", b("/", n("S"), A.Cast("float32", n("N"))))
    assert printer.stmt(d.stmts[0]) == "S +=! A(r_i) * alpha"
    # `S()` is an indexed LHS with no indices, distinct from the bare rank-0 `S`
    (s,) = parse_statements("S() = 1")
    assert s.indices == () and s != A.Stmt(ident("S"), None, "=", i(1))


def test_spans_of_expressions() -> None:
    d = one_def("def f(float(N) A) -> (C) {\n  C(i) = 2 * A(i)\n}")
    e = d.stmts[0].rhs
    assert isinstance(e, A.Binary)
    assert (e.span.line, e.span.col, e.span.end_col) == (2, 10, 18)
    assert isinstance(e.rhs, A.Apply)
    assert (e.rhs.span.line, e.rhs.span.col, e.rhs.span.end_col) == (2, 14, 18)
    assert (d.params[0].name.span.line, d.params[0].name.span.col) == (1, 16)


def test_short_form() -> None:
    stmts = parse_statements("# matmul\nC(i, j) +=! A(i, k) * B(k, j)\n"
                             "D(i, j) = C(i, j) where exists A(i, 0)\n"
                             "S +=! D(r_i, r_j)")
    assert stmts == (
        A.Stmt(ident("C"), (ident("i"), ident("j")), "+=!", b("*", app("A", n("i"), n("k")), app("B", n("k"), n("j")))),
        A.Stmt(ident("D"), (ident("i"), ident("j")), "=", app("C", n("i"), n("j")),
               (A.WhereExists(app("A", n("i"), i(0))),)),
        A.Stmt(ident("S"), None, "+=!", app("D", n("r_i"), n("r_j"))),
    )
    assert parse_statements("") == ()
    assert parse_statements("  # only a comment\n") == ()


@pytest.mark.parametrize("text,short", [
    ("C(i) +=! A(i)", True),
    ("def f(float(N) A) -> (C) { C(i) = A(i) }", False),
    ("# comment\n// def g\n  def f(float(N) A) -> (C) { C(i) = A(i) }", False),
    ("define(i) = A(i)", True),
    ("default(i) = A(i)\n", True),
    ("", True),
])
def test_is_short_form(text: str, short: bool) -> None:
    assert is_short_form(text) is short


# ---- (b) located syntax errors ---------------------------------------------------------------

H = "def f(float(N) A, float(N) B) -> (C) {\n"

SYNTAX_ERRORS = [
    # id, source, line, col, message fragment
    ("missing_rhs", H + "  C(i) = A(i) +\n}", 3, 1, "unexpected '}'"),
    ("bad_char", H + "  C(i) = A(i) $ 2\n}", 2, 15, "unexpected character '$'"),
    ("bad_char_line3", H + "  C(i) = A(i)\n  D(i) = B(i) @ 2\n}", 3, 15, "unexpected character '@'"),
    ("unicode_char", H + "  C(i) = A(i) \u00d7 2\n}", 2, 15, "unexpected character '\u00d7'"),
    ("single_amp", H + "  C(i) = A(i) & B(i)\n}", 2, 15, "unexpected character '&'"),
    ("missing_close_brace", H + "  C(i) = A(i)\n", 1, 38, "'{' was never closed"),
    ("where_let_reduction_op", H + "  C(i) = A(i) where x += 2\n}", 2, 23, "where-let is written `x = expr`"),
    ("outputs_without_parens", "def f(float(N) A)\n  -> C {\n  C(i) = A(i)\n}", 2, 6, "expected '('"),
    ("missing_operator", H + "  C(i) A(i)\n}", 2, 8, "expected an assignment operator"),
    ("minus_assign", H + "  C(i) -= A(i)\n}", 2, 8, "unexpected '-'"),
    ("bare_min", H + "  C(i) min A(i)\n}", 2, 8, "unexpected 'min'"),
    ("lhs_expression", H + "  C(i + 1) = A(i)\n}", 2, 7, "unexpected '+'"),
    ("lhs_negative_literal", H + "  C(-1) = A(0)\n}", 2, 5, "unexpected '-'"),
    ("unbalanced_paren", H + "  C(i) = (A(i) + B(i)\n}", 2, 10, "'(' was never closed"),
    ("extra_paren", H + "  C(i) = A(i))\n}", 2, 14, "unexpected ')'"),
    ("trailing_comma_in_call", H + "  C(i) = A(i,)\n}", 2, 14, "unexpected ')'"),
    ("param_without_type", "def f(\n  (N) A) -> (C) {\n  C(i) = A(i)\n}", 2, 3, "unexpected '('"),
    ("param_without_name", "def f(float(N) A,\n  float(N)) -> (C) {\n  C(i) = A(i)\n}", 2, 11, "expected a name"),
    ("param_missing_comma", "def f(float(N) A\n  float(N) B) -> (C) {\n  C(i) = A(i)\n}", 2, 3, "unexpected 'float'"),
    ("dim_expression", "def f(float(N) A,\n  float(N + 1) B) -> (C) {\n  C(i) = A(i)\n}", 2, 11, "unexpected '+'"),
    ("negative_dim", "def f(float(N) A,\n      float(-1) B) -> (C) {\n  C(i) = A(i)\n}", 2, 13, "unexpected '-'"),
    ("float_dim", "def f(float(N) A,\n      float(2.5) B) -> (C) {\n  C(i) = A(i)\n}", 2, 13, "unexpected '2.5'"),
    ("missing_arrow", "def f(float(N) A)\n  (C) {\n  C(i) = A(i)\n}", 2, 3, "expected '->'"),
    ("missing_open_brace", "def f(float(N) A) -> (C)\n  C(i) = A(i)\n}", 2, 3, "expected '{'"),
    ("def_without_name", "def (float(N) A) -> (C) {\n  C(i) = A(i)\n}", 1, 5, "expected a name"),
    ("output_without_name", "def f(float(N) A) -> (\n  float(N)) {\n  C(i) = A(i)\n}", 2, 11, "expected a name"),
    ("where_range_without_in", H + "  C(i) = A(i)\n    where i 0:N\n}", 3, 13, "unexpected '0'"),
    ("where_range_without_hi", H + "  C(i) = A(i) where i in 0:\n}", 3, 1, "unexpected '}'"),
    ("where_range_without_colon", H + "  C(i) = A(i) where i in N\n}", 3, 1, "expected ':'"),
    ("where_trailing_comma", H + "  C(i) = A(i) where i in 0:N,\n}", 3, 1, "expected a name"),
    ("where_twice", H + "  C(i) = A(i) where i in 0:N\n    where j in 0:N\n}", 3, 5, "unexpected 'where'"),
    ("exists_without_access", H + "  C(i) = A(i) where exists 3\n}", 2, 28, "unexpected '3'"),
    ("ternary_without_colon", H + "  C(i) = A(i) > 0 ? A(i)\n}", 3, 1, "expected ':'"),
    ("double_question", H + "  C(i) = A(i) ?? B(i)\n}", 2, 16, "unexpected '?'"),
    ("double_star", H + "  C(i) = A(i) * * B(i)\n}", 2, 17, "unexpected '*'"),
    ("cast_two_args", H + "  C(i) = float(A(i), B(i))\n}", 2, 20, "unexpected ','"),
    ("cast_no_arg", H + "  C(i) = float()\n}", 2, 16, "unexpected ')'"),
    ("type_as_value", H + "  C(i) = float * A(i)\n}", 2, 16, "unexpected '*'"),
    ("chained_assignment", H + "  C(i) = B(i) = A(i)\n}", 2, 15, "unexpected '='"),
    ("nested_def", H + "  def g() -> () {}\n}", 2, 7, "unexpected 'g'"),
    ("junk_after_def", H + "  C(i) = A(i)\n}\nfoo", 4, 1, "unexpected 'foo'; expected 'def'"),
    ("short_form_in_module", "\nC(i) = A(i)", 2, 1, "expected 'def'"),
    ("crlf_bad_char", "def f(float(N) A) -> (C) {\r\n  C(i) = A(i) $\r\n}", 2, 15, "unexpected character '$'"),
    ("float_out_of_range", H + "  C(i) = A(i) *\n     1e39\n}", 3, 6, "float literal 1e39 is out of the float32 range"),
    ("keyword_tensor", H + "  C(i) = A(i)\n  where(i) = A(i)\n}", 3, 8, "unexpected '('"),
    ("keyword_index", H + "  C(i) = A(i)\n  D(in) = A(in)\n}", 3, 5, "'in' is a keyword and cannot be used as a name"),
    ("type_as_param_name", "def f(float(N) A,\n  float(N) float) -> (C) {\n  C(i) = A(i)\n}", 2, 12,
     "'float' is a keyword"),
]


def _loc(e: TcError) -> Location:
    assert e.location is not None, str(e)
    return e.location


def _lc(e: TcError) -> tuple[int, int]:
    return _loc(e).line, _loc(e).col


def _check_error_text(e: TcError, filename: str, line: int, col: int) -> None:
    text = str(e)
    assert text.startswith(f"{filename}:{line}:{col}: ")
    assert e.location is not None
    lines = text.split("\n")
    assert len(lines) == 3, text
    assert lines[1] == "    " + _loc(e).source_line
    assert lines[2].strip() and set(lines[2].strip()) == {"^"}
    assert lines[2].index("^") == 4 + col - 1
    assert len(lines[2].strip()) == _loc(e).width
    assert "Token(" not in text and "lark" not in text.lower()
    assert "Token(" not in e.message and "lark" not in e.message.lower()


@pytest.mark.parametrize("name,src,line,col,fragment", SYNTAX_ERRORS, ids=[c[0] for c in SYNTAX_ERRORS])
def test_syntax_error_located(name: str, src: str, line: int, col: int, fragment: str) -> None:
    with pytest.raises(TcSyntaxError) as info:
        parse(src)
    e = info.value
    assert isinstance(e, TcError)
    assert _lc(e) == (line, col), str(e)
    assert _loc(e).file == "<string>"
    assert _loc(e).source_line == src.splitlines()[line - 1]
    assert fragment in e.message
    _check_error_text(e, "<string>", line, col)
    # Lark's exception is not chained into what users see
    assert e.__cause__ is None and e.__suppress_context__


def test_syntax_error_names_the_file_and_pickles() -> None:
    src = "def f(float(N) A) -> (C) {\n  C(i) = A(i) $ 1\n}"
    with pytest.raises(TcSyntaxError) as info:
        tcdsl.define(src, filename="kernels/f.tc")
    e = info.value
    assert str(e).startswith("kernels/f.tc:2:15: unexpected character '$'")
    _check_error_text(e, "kernels/f.tc", 2, 15)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is TcSyntaxError
    assert (back.message, back.location, str(back)) == (e.message, e.location, str(e))


def test_short_form_syntax_errors() -> None:
    with pytest.raises(TcSyntaxError) as info:
        parse_statements("C(i) = A(i)\nD(i) = ")
    assert _lc(info.value) == (2, 7)
    assert "unexpected end of text" in info.value.message
    with pytest.raises(TcSyntaxError) as info:
        parse_statements("C(i) +=! A(i)\n  E(i) = A(i) where i in 0:N extra(i)")
    # `extra(i)` starts a new statement, which then lacks its operator
    assert _lc(info.value) == (2, 38)
    assert "unexpected end of text; expected" in info.value.message
    with pytest.raises(TcSyntaxError) as info:

        @tcdsl.define("C(i) +=! A(i) #\n  * ) B(i)")
        def bad(A, B): ...
    assert _lc(info.value) == (2, 5)


def test_empty_source_is_a_syntax_error() -> None:
    with pytest.raises(TcSyntaxError) as info:
        parse("")
    assert "expected 'def'" in info.value.message
    assert _lc(info.value) == (1, 1)


def test_eof_error_ignores_trailing_comments() -> None:
    # the unclosed '{' is the error; where the parser stopped is the end of the last token, not
    # the end of a trailing comment
    for tail in ["", "\n", "\n  # the end\n", "  // done\n\n"]:
        with pytest.raises(TcSyntaxError) as info:
            parse("def f(float(N) A) -> (C) {\n  C(i) = A(i)" + tail)
        assert _lc(info.value) == (1, 26), repr(tail)
        assert "stopped at 2:14" in str(info.value), repr(tail)


def test_first_reserved_word_is_reported() -> None:
    with pytest.raises(TcSyntaxError) as info:
        parse("def exists(float(N) A) -> (C) {\n  C(i) = where\n}")
    assert _lc(info.value) == (1, 5)
    assert "'exists' is a keyword" in info.value.message


_RESERVED_KEYWORDS = ("def", "where", "in", "exists")


@pytest.mark.parametrize("word", ["def", "where", "in", "exists", "float", "double", "int32", "bool"])
def test_reserved_words_are_not_names(word: str) -> None:
    for src, line, col in [
        (f"def f(float(N) A) -> (C) {{\n  {word}(i) = A(i)\n  C(i) = A(i)\n}}", 2, 3),
        (f"def f(float(N) A) -> (C) {{\n  C(i) = A(i) where i in 0:N, exists {word}(i)\n}}", 2, 38),
        (f"def f(float(N) A, float(N)\n {word}) -> (C) {{\n  C(i) = A(i)\n}}", 2, 2),
    ]:
        with pytest.raises(TcSyntaxError) as info:
            parse(src)
        assert _lc(info.value) == (line, col), (src, str(info.value))
    # as an output: a keyword is refused at the word; a type name starts a typed output, which then lacks its name
    with pytest.raises(TcSyntaxError) as info:
        parse(f"def f(float(N) A) -> (C, {word}) {{\n  C(i) = A(i)\n}}")
    if word in _RESERVED_KEYWORDS:
        assert _lc(info.value) == (1, 26)
        assert f"'{word}' is a keyword" in info.value.message
    else:
        assert _lc(info.value) == (1, 26 + len(word))
        assert "unexpected ')'" in info.value.message
    # as a value: a keyword is refused at the word; a type name is a cast, which then lacks its '('
    with pytest.raises(TcSyntaxError) as info:
        parse(f"def f(float(N) A) -> (C) {{\n  C(i) = A(i)\n  D(i) = {word} + A(i)\n}}")
    if word in _RESERVED_KEYWORDS:
        assert _lc(info.value) == (3, 10)
    else:
        assert _lc(info.value) == (3, 11 + len(word))
        assert "unexpected '+'; expected '('" in info.value.message


def test_float_literal_out_of_range() -> None:
    with pytest.raises(TcSyntaxError) as info:
        parse("def f(float(N) A) -> (B) {\n  B(i) = 1e400 + A(i)\n}")
    assert _lc(info.value) + (_loc(info.value).width,) == (2, 10, 5)
    assert "out of the float32 range" in info.value.message
    # the largest float32 is fine and round-trips
    m = parse("def f(float(N) A) -> (B) {\n  B(i) = 3.4028234663852886e38 + A(i)\n}")
    assert parse(printer.module(m)) == m


def test_caret_aligned_with_tabs() -> None:
    with pytest.raises(TcSyntaxError) as info:
        parse("def f(float(N) A) -> (C) {\n\tC(i) = A(i) ^ 2\n}")
    e = info.value
    assert _lc(e) == (2, 14)
    _, source, caret = str(e).split("\n")
    source, caret = source.expandtabs(8), caret.expandtabs(8)
    assert source[caret.index("^")] == "^"


# ---- (c) printer round trips -------------------------------------------------------------------

ROUND_TRIP_DEFS = [
    "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
    "def types(bool(N) A, int8(N) B, int16(N) C, int64(N) D, uint8(N) E, uint16(N) F, uint32(N) G, "
    "uint64(N) H, float16(N) I, double(N) J) -> (O) { O(i) = float(A(i)) + B(i) + C(i) + D(i) + E(i) + F(i) "
    "+ G(i) + H(i) + I(i) + J(i) }",
    "def scal(float(N) A, float alpha, int32 k) -> (float S, int64 T) { S +=! alpha * A(r_i)\n T = int64(k) }",
    "def lit(float(3, N, 4) A) -> (float(3, N) B) { B(i, j) +=! A(i, j, r_k) }",
    "def ops(float(N) A) -> (B, C, D, E, F, G, H, I, J) { B(i) = A(i)\n C(i) += A(i)\n D(i) *=! A(i)\n"
    " E(i) min=! A(i)\n F(i) max=! A(i)\n G(i) +=! A(i)\n C(i) += A(i)\n D(i) *= 2.0\n E(i) min= 0.0\n"
    " F(i) max= 1.0\n H(i) = 0\n I(i) = 1 J(i) = 2 }",
    "def prec(float(N) a, float(N) b, float(N) c) -> (O) { O(i) = (a(i) + b(i)) * c(i) - a(i) / (b(i) * c(i)) "
    "- (a(i) - (b(i) - c(i))) }",
    "def logic(int32(N) a, int32(N) b) -> (O) { O(i) = (a(i) || b(i)) && !(a(i) == b(i)) || !a(i) != b(i) }",
    "def cmp(float(N) a) -> (O) { O(i) = (a(i) < 1.0) == (a(i) >= 2.0) != (a(i) <= 3.0 > 0) }",
    "def tern(float(N) a) -> (O) { O(i) = a(i) > 0 ? a(i) < 1 ? a(i) : 1.0 : (a(i) < -1 ? -1.0 : a(i)) "
    "+ (a(i) ? 1 : 2) * 3 }",
    "def tern2(float(N) a) -> (O) { O(i) = (a(i) > 0 ? 1.0 : 2.0) ? 3.0 : 4.0 }",
    "def unary(float(N) a) -> (O) { O(i) = - -a(i) + -(a(i) * 2) - +a(i) * !!a(i) - -!a(i) }",
    "def calls(float(N) a) -> (O) { O(i) = fma(a(i), 2.0, exp(-a(i))) + pow(a(i), 0.5) + "
    "atan2(sigmoid(a(i)), tanh(a(i))) + min(a(i), max(0.0, a(i))) }",
    "def casts(int32(N) a) -> (O) { O(i) = double(a(i)) / float64(N) + float16(a(i)) + uint8(int8(a(i))) }",
    "def nums(float(N) a) -> (O) { O(i) = a(i) * 1e-05 + 1e16 + .5 + 2. + 1.5E3 + 0.1 + 1234567890123 "
    "+ 3.4028234663852886e38 + 5e-324 }",
    "def idx(float(N, M) a) -> (O) { O(i, j) = a(N - 1 - i, (j + 1) % M) + a(i / 2, 2 * j / 3) }",
    "def gather(float(V, D) T, int32(B, L) Idx) -> (O) { O(b, d) +=! T(Idx(b, r_l), d) }",
    "def wheres(float(N, H) I) -> (O) { O(n, h) +=! I(n, h + r_k - 1) * w where h in 0:H, r_k in 0:3, "
    "w = 1.0 / 3.0, exists I(n, 0) }",
    "def wrange(float(N) I) -> (O) { O(i) +=! I(2 * i + r) where i in (N - 1) / 2:N * 2 - (N - 1), "
    "r in (a ? 1 : 0):(a || b) }",
    "def wlet(float(N) I) -> (O) { O(i) = y where y = I(i) > 0 ? I(i) : 0.0, z = y * y }",
    "def rank0lhs(float(N) I, float s) -> (S, P) { S +=! I(r_i)\n P = S * s\n S = P }",
    "def noparams() -> () { }",
    "def empty_dims(float() A) -> (float() B) { B() = A() }",
    "def bigint(int64(N) a) -> (O) { O(i) = a(i) + 99999999999999999999999 }",
    "def zero_arity(float(N) a) -> (O) { O(i) = a(i) + f() }",
]


def _round_trip(m: A.Module) -> None:
    text = printer.module(m)
    again = parse(text)
    assert again == m, text
    assert printer.module(again) == text


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_round_trip(path: Path) -> None:
    m = parse(path.read_text(encoding="utf-8"), filename=str(path))
    assert m.defs
    _round_trip(m)


def test_examples_present() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"matmul.tc", "conv2d.tc", "pooling.tc", "softmax.tc", "layernorm.tc", "mlp.tc", "gather.tc",
            "padded_conv.tc"} <= names


@pytest.mark.parametrize("src", ROUND_TRIP_DEFS, ids=[s.split("(")[0][4:] for s in ROUND_TRIP_DEFS])
def test_defs_round_trip(src: str) -> None:
    _round_trip(parse(src))


def test_multi_def_module_round_trip() -> None:
    m = parse("\n".join(ROUND_TRIP_DEFS))
    assert len(m.defs) == len(ROUND_TRIP_DEFS)
    _round_trip(m)
    text = printer.module(m)
    assert text.endswith("}\n") and "\n\ndef " in text


def test_canonical_text() -> None:
    m = parse("def  f( float ( N,3 )A,double s )->( C,float(N)D ){\n"
              "   C( i )+=!A(i,r_k)*s   where r_k in 0:3\n"
              "   D(i)=C(i)}")
    assert printer.module(m) == ("def f(float32(N, 3) A, float64 s) -> (C, float32(N) D) {\n"
                                 "  C(i) +=! A(i, r_k) * s where r_k in 0:3\n"
                                 "  D(i) = C(i)\n"
                                 "}\n")
    assert printer.definition(m.defs[0], indent="    ").splitlines()[1] == "    C(i) +=! A(i, r_k) * s where r_k in 0:3"


@pytest.mark.parametrize("text,printed", [
    ("(a + b) * c", "(a + b) * c"),
    ("a + (b * c)", "a + b * c"),
    ("a - (b - c)", "a - (b - c)"),
    ("(a - b) - c", "a - b - c"),
    ("a / (b * c)", "a / (b * c)"),
    ("(a * b) / c", "a * b / c"),
    ("a % (b / c)", "a % (b / c)"),
    ("(a || b) && c", "(a || b) && c"),
    ("a || (b && c)", "a || b && c"),
    ("!(a == b)", "!(a == b)"),
    ("(!a) == b", "!a == b"),
    ("-(a * b)", "-(a * b)"),
    ("(-a) * b", "-a * b"),
    ("-(-a)", "--a"),
    ("-(f(x))", "-f(x)"),
    ("(a < b) < c", "a < b < c"),
    ("a < (b < c)", "a < (b < c)"),
    ("a == (b == c)", "a == (b == c)"),
    ("(a + b) < (c * d)", "a + b < c * d"),
    ("a ? b : (c ? d : e)", "a ? b : c ? d : e"),
    ("(a ? b : c) ? d : e", "(a ? b : c) ? d : e"),
    ("a ? (b ? c : d) : e", "a ? b ? c : d : e"),
    ("(a ? b : c) + d", "(a ? b : c) + d"),
    ("d * (a ? b : c)", "d * (a ? b : c)"),
    ("(a || b) ? c : d", "a || b ? c : d"),
    ("f((a + b), ((c)))", "f(a + b, c)"),
    ("float((a + b))", "float32(a + b)"),
    ("((((1))))", "1"),
    ("- 1", "-1"),
    ("1.50", "1.5"),
    ("1e3", "1000.0"),
    ("2.", "2.0"),
    (".25", "0.25"),
])
def test_printer_parenthesizes_only_where_needed(text: str, printed: str) -> None:
    e = rhs(text)
    assert printer.expr(e) == printed
    assert rhs(printed) == e


def test_printer_where_bounds() -> None:
    (s,) = parse_statements("O(i) = A(i) where i in (a ? 0 : 1):(N + 1), j in (N - 1) / 2:N")
    assert printer.stmt(s) == "O(i) = A(i) where i in (a ? 0 : 1):N + 1, j in (N - 1) / 2:N"
    assert parse_statements(printer.stmt(s)) == (s,)


# ---- (d) hypothesis: random expressions round-trip through the printer ---------------------------

_RESERVED = {"def", "where", "in", "exists", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "uint32", "uint64", "float16", "float32", "float", "float64", "double"}
NAMES = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}\Z").filter(lambda s: s not in _RESERVED)
CANONICAL_TYPES = sorted({c for _, c in TYPES})

leaves = st.one_of(
    st.builds(lambda v: A.Num(v, False), st.integers(min_value=0, max_value=2**70)),
    st.builds(lambda v: A.Num(abs(v), True),
              st.floats(min_value=0.0, max_value=3.4e38, allow_nan=False, allow_infinity=False)),
    st.builds(A.Name, NAMES),
)


def _extend(children: st.SearchStrategy[A.Expr]) -> st.SearchStrategy[A.Expr]:
    return st.one_of(
        st.builds(A.Binary, st.sampled_from(["||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%"]),
                  children, children),
        st.builds(A.Unary, st.sampled_from(["-", "+", "!"]), children),
        st.builds(A.Ternary, children, children, children),
        st.builds(A.Apply, NAMES, st.lists(children, max_size=3).map(tuple)),
        st.builds(A.Cast, st.sampled_from(CANONICAL_TYPES), children),
    )


EXPRS = st.recursive(leaves, _extend, max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(EXPRS)
def test_random_expression_round_trip(e: A.Expr) -> None:
    s = A.Stmt(A.Ident("O"), (A.Ident("i"),), "+=!", e)
    text = printer.stmt(s)
    assert parse_statements(text) == (s,), text
    assert printer.expr(rhs(printer.expr(e))) == printer.expr(e)


WHERES = st.one_of(
    st.builds(A.WhereRange, st.builds(A.Ident, NAMES), EXPRS, EXPRS),
    st.builds(lambda name, args: A.WhereExists(A.Apply(name, tuple(args))), NAMES, st.lists(EXPRS, max_size=2)),
    st.builds(A.WhereLet, st.builds(A.Ident, NAMES), EXPRS),
)
STMTS = st.builds(
    A.Stmt,
    st.builds(A.Ident, NAMES),
    st.one_of(st.none(), st.lists(st.builds(A.Ident, NAMES), max_size=3).map(tuple)),
    st.sampled_from(list(A.ASSIGN_OPS)),
    EXPRS,
    st.lists(WHERES, max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(STMTS, min_size=1, max_size=4))
def test_random_def_round_trip(stmts: list[A.Stmt]) -> None:
    d = A.Def(A.Ident("k"), (A.Param("float32", A.Ident("A"), (A.Dim(name="N"), A.Dim(value=3))),),
              (A.Output(A.Ident("O")),), tuple(stmts))
    m = A.Module((d,))
    _round_trip(m)
    assert parse_statements("\n".join(printer.stmt(s) for s in stmts)) == tuple(stmts)


# ---- the examples compute what their comments say -------------------------------------------------


def _example(name: str):  # type: ignore[no-untyped-def]
    path = next(p for p in EXAMPLES if p.name == name)
    return tcdsl.define(path.read_text(encoding="utf-8"), filename=str(path))


def _conv_valid(x, w, stride=1):  # type: ignore[no-untyped-def]
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    ho, wo = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, f, ho, wo), dtype=np.float64)
    for a in range(kh):
        for b2 in range(kw):
            patch = x[:, :, a:a + stride * (ho - 1) + 1:stride, b2:b2 + stride * (wo - 1) + 1:stride]
            out += np.einsum("nchw,fc->nfhw", patch, w[:, :, a, b2])
    return out


def test_examples_compute() -> None:
    rng = np.random.default_rng(0)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    # sums of products: within c * eps * K of their sums of |terms| (tolerance.assert_sum_close)
    mm = _example("matmul.tc")
    a, bm, c0 = r(3, 4), r(5, 4), r(3, 5)
    assert_sum_close(mm.matmul(a, bm.T.copy()), lambda a, b: a @ b.T, a, bm, terms=4)
    x, y = r(2, 3, 4), r(2, 4, 5)
    assert_sum_close(mm.batch_matmul(x, y), np.matmul, x, y, terms=4)
    assert_sum_close(mm.gemm_nt(a, bm, c0, np.float32(2.0), np.float32(0.5)),
                     lambda a, b, c: 2 * a @ b.T + 0.5 * c, a, bm, c0, terms=5)

    conv = _example("conv2d.tc")
    img, w, bias = r(2, 3, 7, 8), r(4, 3, 3, 2), r(4)
    assert_sum_close(conv.conv2d_bias(img, w, bias), lambda i, w, b: _conv_valid(i, w) + b[None, :, None, None],
                     img, w, bias, terms=19)
    w3 = r(4, 3, 3, 3)
    out = conv.conv2d_strided(img, w3)
    assert out.shape == (2, 4, 3, 3)
    assert_sum_close(out, lambda i, w: _conv_valid(i, w, stride=2), img, w3, terms=27)

    pool = _example("pooling.tc")
    img = r(2, 3, 6, 8)
    np.testing.assert_array_equal(pool.maxpool2x2(img), img.reshape(2, 3, 3, 2, 4, 2).max(axis=(3, 5)))
    assert_sum_close(pool.avgpool2x2(img), lambda i: i.reshape(2, 3, 3, 2, 4, 2).mean(axis=(3, 5)), img, terms=4)

    x = r(4, 6)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    assert_close(_example("softmax.tc")(x), e / e.sum(axis=1, keepdims=True), terms=6)

    gamma, beta = r(6), r(6)
    mean, var = x64.mean(axis=1, keepdims=True), x64.var(axis=1, keepdims=True)
    assert_close(_example("layernorm.tc")(x, gamma, beta, np.float32(1e-5)),
                 gamma * (x64 - mean) / np.sqrt(var + 1e-5) + beta, terms=12)  # two 6-term sums

    mlp = _example("mlp.tc")
    xb, w1, b1, w2, b2 = r(3, 5), r(7, 5), r(7), r(2, 7), r(2)
    # relu neither grows an error nor a sum of |terms|: the chain's bound is that of 6 + 8 terms
    assert_sum_close(mlp.mlp2(xb, w1, b1, w2, b2), lambda x, w1, b1, w2, b2: np.maximum(x @ w1.T + b1, 0) @ w2.T + b2,
                     xb, w1, b1, w2, b2, terms=14)
    wz = r(4, 5)
    xb[0], wz[0] = 10.0, 1.0  # z[0, 0] = 50: past the clip, exactly 1
    zz = xb.astype(np.float64) @ wz.T.astype(np.float64)
    got = mlp.dense_sigmoid(xb, wz)
    assert got[0, 0] == 1.0
    # the sigmoid's slope is at most 1/4: z's error bound carries over, plus its own roundings
    assert_close(got, np.where(zz > 30, 1.0, 1 / (1 + np.exp(-zz))), terms=5, scale=np.abs(xb) @ np.abs(wz.T))

    g = _example("gather.tc")
    table = r(10, 4)
    idx = np.array([[0, 9, 3], [3, 3, 1]], dtype=np.int32)
    np.testing.assert_array_equal(g.embedding(table, idx), table[idx])
    assert_sum_close(g.embedding_bag(table, idx.astype(np.int64)), lambda t: t[idx].sum(axis=1), table, terms=3)

    img, w = r(2, 3, 5, 6), r(4, 3, 3, 3)
    assert_sum_close(_example("padded_conv.tc")(img, w),
                     lambda i, w: _conv_valid(np.pad(i, ((0, 0), (0, 0), (1, 1), (1, 1))), w), img, w, terms=27)
