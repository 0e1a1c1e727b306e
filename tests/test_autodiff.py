"""Derived backward defs (tcdsl.autodiff), without torch.

Every def of ``tests/grad_defs.py``: its backward def runs on the C backend and on the reference
interpreter with equal results (nine of them on the GPU mapping too, OpenCL), and those gradients
match central finite differences of the forward. Also: the shapes of derived defs (inverted accesses,
divisibility tests, recomputation and saved values, ``wrt``), and the located errors for what
cannot be differentiated.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.autodiff import derive
from tcdsl.core.sema import check_module
from tcdsl.errors import TcGradientError
from tcdsl.grammar import parse

sys.path.insert(0, str(Path(__file__).parent))
from grad_defs import CASES, GradCase, make  # noqa: E402
from tolerance import C_ABS, assert_close, eps  # noqa: E402


def _checked(src: str):
    return check_module(parse(src))[0]


def _as_list(x):
    return list(x) if isinstance(x, tuple) else [x]


def _terms(arrays: list[np.ndarray]) -> int:
    """A generous bound on the terms summed into one gradient element: each term reads one element
    of some argument, so there are at most as many as the arguments hold in all."""
    return sum(int(np.size(a)) for a in arrays)


def _backward_args(case: GradCase, seed: int = 0):
    """The forward's inputs, output cotangents and the backward def's arguments."""
    c = _checked(case.source)
    bw = derive(c)
    xs = make(case, seed)
    fwd = tc.define(bw.forward_source or case.source)
    outs = _as_list(fwd(*xs, backend="numpy"))
    rng = np.random.default_rng(seed + 1)
    cots = [rng.random(np.shape(o)) - 0.5 for o in outs[: len(c.outputs)]]
    values = {t.name: x for t, x in zip(c.inputs, xs)}
    values.update({n: o for n, o in zip([t.name for t in c.outputs] + list(bw.saved), outs)})
    grads = {t.name: g for t, g in zip(c.outputs, cots)}
    args = [grads[p.of] if p.role == "grad" else values[p.name] for p in bw.params]
    return c, bw, xs, cots, args


@pytest.mark.cpu
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backward_matches_interpreter_and_finite_differences(case: GradCase) -> None:
    c, bw, xs, cots, args = _backward_args(case)
    bk = tc.define(bw.source)
    got_c = _as_list(bk(*args, backend="c"))
    got_i = _as_list(bk(*args, backend="numpy"))
    assert len(got_c) == len(bw.grads) == len([t for t in c.inputs if t.dtype == "float64"])
    for name, a, b in zip(bw.grads, got_c, got_i):
        assert_close(a, b, terms=_terms(args), err_msg=f"d_{name}: C vs interpreter")
    fwd = tc.define(case.source)

    def loss(values: list[np.ndarray]) -> float:
        return sum(float(np.sum(o * g)) for o, g in zip(_as_list(fwd(*values, backend="numpy")), cots))

    names = [t.name for t in c.inputs]
    h = 1e-6
    # the loss's own rounding (its sums of |terms|) differs between the two sides: divided by 2h
    outs = _as_list(fwd(*xs, backend="numpy"))
    loss_terms = sum(float(np.sum(np.abs(o * g))) for o, g in zip(outs, cots))
    fd_atol = C_ABS * eps(np.float64) * _terms(xs) * loss_terms / (2 * h)
    for name, g in zip(bw.grads, got_i):
        i = names.index(name)
        num = np.zeros(np.shape(xs[i]))
        for idx in np.ndindex(num.shape):
            plus = [x.copy() for x in xs]
            minus = [x.copy() for x in xs]
            plus[i][idx] += h
            minus[i][idx] -= h
            num[idx] = (loss(plus) - loss(minus)) / (2 * h)
        # rtol: the difference quotient's truncation error, O(h^2) relative to the derivative
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=fd_atol, err_msg=f"d_{name} vs finite differences")


GPU_CASES = [c for c in CASES if c.name in ("strided_conv", "padded_conv", "conv_bias_relu_in_place", "maxpool",
                                           "dilated_maxpool", "softmax", "gather", "conditional_reads_and_updates",
                                           "min_max_after_init")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.name for c in GPU_CASES])
def test_backward_on_the_gpu_mapping(case: GradCase) -> None:
    """Backward defs run on the GPU mapping too (the OpenCL backend: PoCL on any machine)."""
    from conftest import has_opencl

    if not has_opencl():
        pytest.skip("no OpenCL platform")
    _, bw, _, _, args = _backward_args(case)
    bk = tc.define(bw.source)
    for name, a, b in zip(bw.grads, _as_list(bk(*args, backend="opencl")), _as_list(bk(*args, backend="numpy"))):
        assert_close(a, b, terms=_terms(args), err_msg=f"d_{name}: OpenCL vs interpreter")


def _case(name: str) -> GradCase:
    return next(c for c in CASES if c.name == name)


def test_conv_input_gradient_inverts_the_access() -> None:
    src = tc.define(_case("conv2d").source).backward_source()
    line = next(x for x in src.splitlines() if x.strip().startswith("d_I("))
    assert "?" not in line and "%" not in line  # h + kh solved for h: no test per point
    assert "Wt(f, c, kh, kw)" in line and "d_O(n, f, x2 - kh, x3 - kw)" in line


def test_strided_conv_input_gradient_sums_in_phases() -> None:
    """``2*h + kh`` with a window wider than the stride: each input row's parity takes its own
    taps. The sum runs per phase (``x2 = 2*x2_q + x2_p``, ``h = x2_q - h_i``) over a window of fixed
    range, box-shaped: it reads the weights in phases (zeros for the taps a phase lacks) and the
    output gradient zero-padded by the window's reach; the input gradient reads the phases back."""
    strided = tc.define(_case("strided_conv").source).backward_source()
    lines = {x.strip().split("(")[0]: x for x in strided.splitlines() if "(" in x and not x.strip().startswith("#")}
    assert "?" not in lines["d_I"]
    assert "d_I_phases(x2 % 2, x3 % 2, n, c, x2 / 2, x3 / 2)" in lines["d_I"]  # each phase a nest of its own
    summed = lines["d_I_phases"]
    assert "d_O_pad(n, f, x2_q + (KH - 1) / 2 - h_i, x3_q + (KW - 1) / 2 - w_i)" in summed
    assert "Wt_phases(f, x2_p, h_i, x3_p, w_i, c)" in summed and "exists" not in summed  # its channels last
    assert "h_i in 0:(KH - 1) / 2 + 1" in summed
    assert "Wt_phases(p0, q2, j2, q3, j3, p1) = Wt(p0, p1, 2*j2 + q2, 2*j3 + q3)" in lines["Wt_phases"]
    assert "= d_O(p0_2, p1_2, p2 - ((KH - 1) / 2), p3 - ((KW - 1) / 2))" in lines["d_O_pad"]
    padded = tc.define(_case("strided_padded_conv").source).backward_source()
    assert "Wt(p0, p1, 2*j2 + q2 - 1, 2*j3 + q3 - 1)" in padded  # the padding's offset in the taps


def test_strided_weight_gradient_reads_the_input_deinterleaved() -> None:
    """The weight gradient sums ``I(n, c, 2*h + kh, kw + 2*w)`` over ``w``: it reads a copy of the
    input with its columns in phases, contiguous along ``w``."""
    line = _grad_line("strided_conv", "d_Wt")
    assert "I_split(n, c, 2*h + kh, kw % 2, w + kw / 2)" in line and "exists" not in line
    # where the input is also read out of bounds (padding), the one copy is zero-padded as well:
    # the split reads the input at the padding's offset, zeros outside it, in one pass
    for case in ("strided_padded_conv_fixed", "strided_padded_conv"):
        line = _grad_line(case, "d_Wt")
        assert "I_split(n, c, 2*h + kh, kw % 2, w + kw / 2)" in line and "exists" not in line
        copy = _grad_line(case, "I_split")
        assert "= I(p0_3, p1_3, p2_2 - 1, p3_2 + 2*p4 - 1)" in copy
        assert "I_pad" not in tc.define(_case(case).source).backward_source()


def _grad_line(case: str, tensor: str = "d_I") -> str:
    src = tc.define(_case(case).source).backward_source()
    return next(x for x in src.splitlines() if x.strip().startswith(f"{tensor}("))


def test_pool_windows_no_wider_than_the_stride_solve_for_window_and_position() -> None:
    """Each input element lies in at most one window: ``2*h + kh`` solves for both ``h`` and
    ``kh``, so the gradient is one assignment per element, with no sum over the window."""
    line = _grad_line("maxpool")
    assert line.strip().startswith("d_I(n, c, x2, x3) = ") and "kh" not in line and "%" not in line
    assert "O(n, c, x2 / 2, x3 / 2)" in line and "I(n, c, x2, x3)" in line
    assert "O_ties(n, c, h, w) +=!" in tc.define(_case("maxpool").source).backward_source()  # ties share it
    gapped = _grad_line("gapped_pool")  # 3*h + kh + 1, kh in 0:2: every third row gets 0
    assert "((x2 - 1) % 3) < 2" in gapped and "kh" not in gapped and " = " in gapped


def test_overlapping_windows_use_a_divisibility_test() -> None:
    line = _grad_line("overlapping_pool")
    assert "(x2 - kh) % 2" in line and "kh in 0:3" in line and "+=!" in line


def test_recomputation_and_saved_temporaries() -> None:
    c = _checked(_case("softmax").source)
    bw = derive(c)
    # written by reductions: s is kept; mx shifts nothing the output sees (its gradient is zero and
    # nothing reads it); e comes back from the output as Y * s, one product substituted where it is read
    assert bw.saved == ("s",)
    body = [x for x in bw.source.splitlines() if not x.strip().startswith("#")]
    assert not any("exp(" in x or "mx" in x or x.strip().startswith("e(") for x in body)
    assert [x.split("(")[0].strip() for x in body[1:-1]] == ["d_s", "d_X"]  # one reduction, then one pass
    assert "(Y(n, d) * s(n))" in bw.source and "# mx: every output is unchanged when it shifts" in bw.source
    none = derive(c, save=())  # nothing kept: e recomputed from X (s is not at hand), so mx too
    assert none.saved == () and "mx(n) max=! X(n, d)" in none.source and "exp((X(n, d) - mx(n)))" in none.source
    more = derive(c, save={"e": True, "mx": False})
    assert more.saved == ("s", "e") or set(more.saved) == {"s", "e"}
    roles = {p.name: p.role for p in more.params}
    assert roles["e"] == "saved" and roles["d_Y"] == "grad" and roles["X"] == "input"


def test_earlier_versions_written_by_reductions_are_saved() -> None:
    c = _checked(_case("conv_bias_relu_in_place").source)
    bw = derive(c)
    assert bw.saved == ("O_1",)  # the convolution, before the bias and the relu
    assert bw.forward_source is not None and "-> (O, O_1) {" in bw.forward_source
    assert "O_1(n, f, h, w) +=! I(n, c, h + kh, kw + w) * Wt(f, c, kh, kw)" in bw.forward_source.replace("(I(", "I(")\
        .replace("kw)) where", "kw) where")
    assert "+=! (I(" not in bw.source and "((O_1(n, f, h, w) + B(f)) >= float64(0.0))" in bw.source
    again = derive(c, save=())  # nothing kept: the backward recomputes the convolution
    assert again.saved == () and again.forward_source is None and "O_1(n, f, h, w) +=! (I(n, c" in again.source


def test_wrt_limits_the_backward() -> None:
    k = tc.define(_case("matmul").source)
    src = k.backward_source(wrt=("B",))
    assert "-> (float64(K, N) d_B)" in src and "d_A" not in src


def test_backward_source_reparses_to_itself() -> None:
    for case in CASES:
        src = tc.define(case.source).backward_source()
        again = tc.define(src)
        assert again.name.endswith("_grad")


def _located(exc: pytest.ExceptionInfo, line: int, col: int, fragment: str) -> None:
    loc = exc.value.location
    assert loc is not None and (loc.line, loc.col) == (line, col), loc
    assert fragment in exc.value.message


def test_product_reduction_is_not_differentiable() -> None:
    k = tc.define("def p(double(M, N) A) -> (S, P) {\n  S(i) +=! A(i, j)\n  P(i) *=! A(i, j)\n}")
    with pytest.raises(TcGradientError) as exc:
        k.backward_source()
    _located(exc, 3, 3, "statement 2 (line 3, writing 'P'): a product reduction")


def test_bad_wrt_and_save_are_located() -> None:
    k = tc.define("def g(double(V, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }")
    with pytest.raises(TcGradientError) as exc:
        k.backward_source(wrt=("I",))
    _located(exc, 1, 5, "with respect to 'I': not a float input (it is int32)")
    with pytest.raises(TcGradientError) as exc:
        tc.define(_case("softmax").source, save=["Y"])
    _located(exc, 1, 5, "save= names 'Y', which is not a temporary of softmax")


def test_user_backward_with_wrong_params_is_located() -> None:
    bwd = ("def matmul_grad(double(M, K) A, double(M, N) d_C) -> (d_A) {\n"
           "  d_A(m, k) +=! d_C(m, n) * 1.0 where k in 0:K\n}")
    with pytest.raises(TcGradientError) as exc:
        tc.define(_case("matmul").source, backward=bwd)
    _located(exc, 1, 5, "backward def 'matmul_grad' takes 2 params")


def test_cli_prints_the_backward_def(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tcdsl.cli import main

    src = tmp_path / "mm.tc"
    src.write_text(_case("matmul").source + "\n")
    assert main(["grad", str(src), "--wrt", "B"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def matmul_grad(") and "d_B(k, n) +=! (d_C(m, n) * A(m, k))" in out and "d_A" not in out
    assert main(["grad", str(src), "--wrt", "C"]) == 1
    assert "mm.tc:1:5: cannot differentiate matmul with respect to 'C'" in capsys.readouterr().err


def test_every_def_of_the_corpus_derives_or_names_its_product_reduction() -> None:
    """Each def of ``tests/defs.py`` with a float input gets a backward def that checks, runs on the
    interpreter and returns gradients of the inputs' shapes, or raises TcGradientError for a
    product reduction (the only construct without a derived gradient)."""
    from defs import DEFS, make_inputs

    refused = []
    for case in DEFS:
        c = _checked(case.source)
        if not any(t.dtype.startswith("float") for t in c.inputs):
            continue
        try:
            bw = derive(c)
        except TcGradientError as e:
            assert "a product reduction" in e.message
            refused.append(case.name)
            continue
        xs = make_inputs(case.inputs)
        outs = _as_list(tc.define(bw.forward_source or case.source)(*xs, backend="numpy"))
        values = {t.name: x for t, x in zip(c.inputs, xs)}
        values.update({n: o for n, o in zip([t.name for t in c.outputs] + list(bw.saved), outs)})
        grads = {t.name: np.ones_like(o) for t, o in zip(c.outputs, outs)}
        args = [grads[p.of] if p.role == "grad" else values[p.name] for p in bw.params]
        got = _as_list(tc.define(bw.source)(*args, backend="numpy"))
        shapes = {t.name: np.shape(x) for t, x in zip(c.inputs, xs)}
        assert [np.shape(g) for g in got] == [shapes[w] for w in bw.grads], case.name
    assert refused == ["reduce_rows", "reduce_all", "reduce_after_init", "conv1d_padded_sum_prod_max"]


def test_derivatives_read_the_value_a_statement_wrote_where_it_is_at_hand() -> None:
    """exp(u)' = exp(u), tanh(u)' = 1 - tanh(u)^2: the backward reads the value the statement wrote
    when the backward has it anyway (an output, a value other gradients read), and computes the
    builtin again otherwise rather than keeping a temporary only for it."""
    act = tc.define("def act(float(N) A, float(N) B) -> (Y) { Y(i) = tanh(A(i) * B(i)) }").backward_source()
    lines = [x for x in act.splitlines() if x.strip().startswith("d_")]  # (the comments quote the forward)
    assert not any("tanh" in x for x in lines) and all("(1.0 - (Y(i) * Y(i)))" in x for x in lines)
    soft = tc.define("def sm2(float(N, D) X) -> (Y) {\n  mx(n) max=! X(n, d)\n  e(n, d) = exp(X(n, d) - mx(n))\n"
                     "  s(n) +=! e(n, d)\n  Y(n, d) = 2.0 * e(n, d) / s(n)\n}").backward_source()
    body = [x for x in soft.splitlines() if not x.strip().startswith("#")]
    assert sum(x.count("exp(") for x in body) == 1  # e once, then read
    assert sum(x.count("* e(n, d))") for x in body if x.strip().startswith("d_X")) == 1
    inline = tc.define("def act2(float(N) A) -> (Y) {\n  T(i) = exp(A(i))\n  Y(i) = T(i) * 2.0\n}").backward_source()
    code = [x.strip() for x in inline.splitlines() if not x.strip().startswith("#")]
    assert not any(x.startswith("T(") for x in code) and "d_A(i) = ((d_Y(i) * 2.0) * exp(A(i)))" in code[1]


def test_shifts_no_output_sees_carry_no_gradient() -> None:
    """A running max subtracted before exp and normalised away (softmax, log-softmax) gets no
    gradient statements; one whose shift shows in an output keeps them (the corpus checks all three
    against finite differences)."""
    for name, inert in (("softmax", True), ("log_softmax", True), ("unnormalized_exp", False),
                        ("column_normalized", False)):
        src = tc.define(_case(name).source).backward_source()
        assert ("mx_ties" not in src) == inert and ("# mx: every output is unchanged" in src) == inert, name


def test_cheap_temporaries_are_substituted_only_where_read_once_per_point() -> None:
    """A cheap recomputed temporary is substituted into readers that read each of its points once
    (layernorm's xc: no N x D buffer); one read across another loop index (a contraction's operand)
    or at several points of the reader (a pooling window's share) stays a statement, so it is not
    computed again per product or per window point."""
    ln = tc.define(_case("layernorm").source).backward_source()
    code = [x.strip() for x in ln.splitlines() if not x.strip().startswith("#")]
    assert not any(x.startswith("xc(") for x in code) and "(X(n, d) - mean(n))" in ln
    assert sum(x.startswith("d_X(") for x in code) == 1  # its two contributions, one statement
    mm = tc.define("def scaled_mm(float(M, K) A, float(K, N) B) -> (C) {\n  T(i, k) = A(i, k) * 2.0\n"
                   "  C(i, j) +=! T(i, k) * B(k, j)\n}").backward_source()
    code = [x.strip() for x in mm.splitlines() if not x.strip().startswith("#")]
    assert any(x.startswith("T(i, k) = (A(i, k) * 2.0)") for x in code), mm
    # a 2x2 window reads each share four times (x2 / 2): the share stays one statement
    mp = tc.define(_case("maxpool").source).backward_source()
    assert any(x.strip().startswith("d_O_share(n, c, h, w) =") for x in mp.splitlines()), mp


def test_a_temporary_comes_back_from_an_output_only_at_its_own_precision() -> None:
    """Softmax's e comes back as Y * s where Y has e's type; a float16 Y would round e to 11 bits,
    so e is recomputed from X instead (and the max that recomputation needs is saved)."""
    src = _case("softmax").source.replace("double", "float")
    assert "(Y(n, d) * s(n))" in tc.define(src).backward_source()
    half = tc.define(src.replace("-> (Y)", "-> (float16(N, D) Y)").replace("e(n, d) / s(n)", "float16(e(n, d) / s(n))"))
    bw = half.backward_source()
    assert "Y(n, d) * s(n)" not in bw and "exp((X(n, d) - mx(n)))" in bw and "float32(N) mx" in bw


def _padded_weight_gradient(I: np.ndarray, dO: np.ndarray, window: tuple[int, int],
                            after: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The weight gradient of a conv padded by 1 before and ``after`` past the input's rows and
    columns, in float64, and its sums of |terms| (the tolerance's scale)."""
    Ip = np.pad(I.astype(np.float64), ((0, 0), (0, 0), (1, after[0]), (1, after[1])))
    h, w = dO.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(Ip, window, axis=(2, 3))[:, :, :h, :w]  # n c h w kh kw
    d = dO.astype(np.float64)
    return np.einsum("nfhw,nchwkl->fckl", d, win), np.einsum("nfhw,nchwkl->fckl", np.abs(d), np.abs(win))


def test_a_windowed_weight_gradient_reads_a_zero_padded_copy() -> None:
    """A "same" conv's weight gradient sums a product whose input read leaves its bounds near the
    edges: it reads a zero-padded copy of the input (made once, before it), so its nest is a box
    and not one piece per tap. Its input gradient (the left side the input's rows, not a window)
    keeps its reads. The gradients match float64 sums of the zero-padded convolution on the C and
    numpy backends, on sizes that are and are not whole vectors."""
    src = ("def same(float(N, C, H, W) I, float(F, C, 3, 3) Wt) -> (O) {\n"
           "    O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n}")
    k = tc.define(src)
    code = [x.strip() for x in k.backward_source().splitlines() if not x.strip().startswith("#")]
    assert "I_pad(p0, p1, p2, p3) = I(p0, p1, p2 - 1, p3 - 1) where p0 in 0:N, p1 in 0:C, p2 in 0:H + 2, " \
           "p3 in 0:W + 2" in code, code
    d_wt = next(x for x in code if x.startswith("d_Wt("))
    assert "I_pad(n, c, h + kh, kw + w)" in d_wt and code.index(d_wt) > code.index(next(x for x in code
                                                                                     if x.startswith("I_pad(")))
    assert "d_O(n, f, x2 - kh + 1, x3 - kw + 1)" in next(x for x in code if x.startswith("d_I("))
    grad = tc.define(k.backward_source())
    rng = np.random.default_rng(5)
    for n, c, f, h, w in ((2, 3, 4, 5, 7), (1, 2, 3, 16, 33)):
        I, Wt, dO = (rng.standard_normal(s).astype(np.float32) for s in ((n, c, h, w), (f, c, 3, 3), (n, f, h, w)))
        want, scale = _padded_weight_gradient(I, dO, (3, 3), (1, 1))
        # d_I(y, x) sums dO(y - kh + 1, x - kw + 1) * Wt(kh, kw): windows of the padded dO, the taps flipped
        gwin = np.lib.stride_tricks.sliding_window_view(np.pad(dO.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1))),
                                                        (3, 3), axis=(2, 3))
        flipped = Wt.astype(np.float64)[:, :, ::-1, ::-1]
        want_i = np.einsum("nfyxab,fcab->ncyx", gwin, flipped)
        scale_i = np.einsum("nfyxab,fcab->ncyx", np.abs(gwin), np.abs(flipped))
        for backend in ("c", "numpy"):
            d_I, d_Wt = grad(I, Wt, dO, backend=backend)
            assert_close(d_Wt, want, terms=n * h * w, scale=scale, dtype="float32")
            assert_close(d_I, want_i, terms=f * 9, scale=scale_i, dtype="float32")


def test_a_window_of_unknown_size_reads_a_copy_padded_to_its_reach() -> None:
    """With the window's size a size of the def (``float(F, C, KH, KW)``), whether its reads pass
    the input's last rows depends on the sizes: the weight gradient reads a copy holding the rows
    its sum reaches, ``H + KH - 1`` of them from the first pad row (zeros past the input's end,
    and the input's rows the sum never reaches left out). The window's indices are summed by the
    forward: its gradient's left side moves the read by no more than the window. The input
    gradient, whose left side runs over the input's rows, keeps its reads. The numbers are those
    of float64 sums of the zero-padded convolution on the C and numpy backends, for windows that
    do and do not reach past the input (1x1 to 5x4)."""
    src = ("def same(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {\n"
           "    O(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n}")
    k = tc.define(src)
    code = [x.strip() for x in k.backward_source().splitlines() if not x.strip().startswith("#")]
    assert "I_pad(p0, p1, p2, p3) = I(p0, p1, p2 - 1, p3 - 1) where p0 in 0:N, p1 in 0:C, p2 in 0:H + KH - 1, " \
           "p3 in 0:KW + W - 1" in code, code
    assert "I_pad(n, c, h + kh, kw + w)" in next(x for x in code if x.startswith("d_Wt("))
    assert "d_O(n, f, x2 - kh + 1, x3 - kw + 1)" in next(x for x in code if x.startswith("d_I("))
    grad = tc.define(k.backward_source())
    rng = np.random.default_rng(6)
    for n, c, f, h, w, kh, kw in ((2, 3, 4, 5, 7, 3, 3), (1, 2, 3, 9, 17, 1, 1), (1, 2, 2, 6, 19, 5, 4)):
        I, Wt, dO = (rng.standard_normal(s).astype(np.float32) for s in ((n, c, h, w), (f, c, kh, kw), (n, f, h, w)))
        want, scale = _padded_weight_gradient(I, dO, (kh, kw), (max(0, kh - 2), max(0, kw - 2)))
        for backend in ("c", "numpy"):
            _, d_Wt = grad(I, Wt, dO, backend=backend)
            assert_close(d_Wt, want, terms=n * h * w, scale=scale, dtype="float32")
