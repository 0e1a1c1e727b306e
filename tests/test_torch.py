"""PyTorch integration (tcdsl.torch_ops, tcdsl.nn): tensors in and out, autograd through derived or
hand-written backward defs (``gradcheck`` in float64 on the C backend), ``torch.compile``, modules,
and the located errors for tensors a def does not take.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tcdsl as tc  # noqa: E402
from tcdsl.errors import TcArgumentError  # noqa: E402
from tcdsl.nn import TcModule  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from conftest import has_cuda  # noqa: E402
from grad_defs import CASES, GradCase, make  # noqa: E402
from tolerance import assert_close, assert_sum_close  # noqa: E402


def _terms(*arrays) -> int:
    """A generous bound on the terms summed into one element of a result or gradient: each term reads
    one element of some argument, so there are at most as many as the arguments hold in all."""
    return sum(a.numel() if isinstance(a, torch.Tensor) else int(np.size(a)) for a in arrays)


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def _tensors(case: GradCase, seed: int = 0) -> list:
    out = []
    for x in make(case, seed):
        t = torch.from_numpy(x)
        if t.dtype == torch.float64:
            t.requires_grad_(True)
        out.append(t)
    return out


@pytest.mark.cpu
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gradcheck_on_c_backend(case: GradCase) -> None:
    k = tc.define(case.source, backend="c")
    args = _tensors(case)
    got = k(*args)
    want = k(*[a.detach().numpy() for a in args], backend="numpy")
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert isinstance(g, torch.Tensor) and g.dtype == torch.float64
        assert_close(_np(g), w, terms=_terms(*args))
    assert torch.autograd.gradcheck(k, tuple(args), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.cpu
def test_gradients_only_for_inputs_that_require_them() -> None:
    k = tc.define(CASES[0].source)
    A = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    B = torch.rand(4, 2, dtype=torch.float64)
    C = k(A, B)
    C.mul_(2)  # in place: autograd keeps only what the backward def reads (A's gradient needs B, not C)
    C.sum().backward()
    assert_sum_close(A.grad.numpy(), lambda B: 2 * np.ones((3, 2)) @ B.T, B.numpy(), terms=2)
    assert B.grad is None
    with torch.no_grad():
        C = k(A, B)
    assert not C.requires_grad
    assert_sum_close(C.numpy(), np.matmul, _np(A), B.numpy(), terms=4)


@pytest.mark.cpu
def test_non_contiguous_tensors_and_out() -> None:
    k = tc.define(CASES[0].source)
    A = torch.rand(4, 3, dtype=torch.float64).t()  # a transposed view
    B = torch.rand(4, 2, dtype=torch.float64)
    assert_sum_close(k(A, B).numpy(), np.matmul, A.numpy(), B.numpy(), terms=4)
    out = torch.empty(3, 2, dtype=torch.float64)
    assert k(A, B, out=out) is out
    assert_sum_close(out.numpy(), np.matmul, A.numpy(), B.numpy(), terms=4)


@pytest.mark.cpu
def test_repeated_out_calls_on_tensors_write_and_tell_autograd() -> None:
    """Repeated out= calls on tensors of one layout (the numpy views' direct path) write each
    call's numbers, bump the buffer's version as any in-place op does (autograd then refuses a
    backward through a value the call overwrote), and a tensor needing a gradient is still refused."""
    k = tc.define(CASES[0].source)  # matmul, float64
    B = torch.rand(4, 2, dtype=torch.float64)
    out = torch.empty(3, 2, dtype=torch.float64)
    for seed in range(3):
        A = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        version = out._version
        assert k(A, B, out=out) is out
        assert out._version == version + 1
        assert_sum_close(out.numpy(), np.matmul, A.numpy(), B.numpy(), terms=4)
    W = torch.rand(2, dtype=torch.float64, requires_grad=True)
    loss = (out * W).sum()  # saves out for W's gradient
    k(A, B, out=out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(TcArgumentError, match="out= records no gradient"):
        k(A.requires_grad_(True), B, out=out)
    wanting = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)  # a buffer that needs a gradient
    with pytest.raises(TcArgumentError, match="out= records no gradient"):
        k(A.detach(), B, out=wanting)
    with torch.no_grad():  # as torch's own out= ops: written, outside autograd
        assert k(A.detach(), B, out=wanting) is wanting
    assert_sum_close(wanting.detach().numpy(), np.matmul, A.detach().numpy(), B.numpy(), terms=4)


@pytest.mark.cpu
def test_repeated_calls_on_tensors_of_one_layout_run_at_their_addresses() -> None:
    """After a first call, tensors with the same shapes, dtypes and strides go to the kernel by
    their data_ptr (no numpy views): views at an offset, transposed views (a layout of their own),
    tensors that require grad, and the gradients autograd passes the backward def."""
    k = tc.define(CASES[0].source)  # matmul, float64
    big = torch.rand(40, 3, dtype=torch.float64)
    B = torch.rand(3, 5, dtype=torch.float64)
    for lo in (0, 1, 7, 30):  # the same layout at different addresses
        A = big[lo:lo + 4]
        assert_sum_close(k(A, B).numpy(), np.matmul, A.numpy(), B.numpy(), terms=3)
    assert k._tensor_layouts, "the layout was not remembered"
    for _ in range(2):
        At = torch.rand(3, 4, dtype=torch.float64).t()  # strides (1, 4): another layout
        assert_sum_close(k(At, B).numpy(), np.matmul, At.numpy(), B.numpy(), terms=3)
    for _ in range(3):
        A = torch.rand(4, 3, dtype=torch.float64, requires_grad=True)
        Bg = B.clone().requires_grad_(True)
        g = torch.rand(4, 5, dtype=torch.float64)
        k(A, Bg).backward(g)
        assert_sum_close(_np(A.grad), np.matmul, g.numpy(), B.numpy().T, terms=5)
        assert_sum_close(_np(Bg.grad), np.matmul, _np(A).T, g.numpy(), terms=4)


@pytest.mark.cpu
@pytest.mark.parametrize("name", ["matmul", "layernorm", "softmax", "mlp", "gather", "conv_bias_relu_in_place"])
def test_repeated_training_steps_follow_their_plan(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the third step on one layout, a training call runs forward and backward from the plan
    its first steps made (no lookups through the general autograd function) and gives the first
    step's outputs and gradients; a transposed output gradient still gives them, and a double
    backward takes the general way and matches a fresh kernel's."""
    from tcdsl import torch_ops

    case = next(c for c in CASES if c.name == name)
    k = tc.define(case.source)
    general = []
    autograd = torch_ops._autograd
    monkeypatch.setattr(torch_ops, "_autograd", lambda ctx, grads: general.append(1) or autograd(ctx, grads))
    base = _tensors(case)
    needs = [t.requires_grad for t in base]
    terms = _terms(*base)

    def step(g: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        xs = [t.detach().clone().requires_grad_(n) for t, n in zip(base, needs)]
        y = k(*xs)
        y = y[0] if isinstance(y, tuple) else y
        y.backward(torch.ones_like(y) * 0.5 if g is None else g)
        return y.detach(), [x.grad for x in xs if x.requires_grad]

    y0, g0 = step()
    for _ in range(2):
        step()
    del general[:]
    for _ in range(3):
        y, gs = step()
        assert_close(y.numpy(), y0.numpy(), terms=terms)
        for a, b in zip(gs, g0):
            assert_close(a.numpy(), b.numpy(), terms=terms)
    assert not general, "repeated training steps went through the general autograd function"
    if y0.dim() == 2:  # a transposed gradient: contiguous() makes it the layout the plan knows
        gt = (torch.ones(y0.shape[::-1], dtype=y0.dtype) * 0.5).t()
        y, gs = step(gt)
        for a, b in zip(gs, g0):
            assert_close(a.numpy(), b.numpy(), terms=terms)
    xs = [t.detach().clone().requires_grad_(n) for t, n in zip(base, needs)]
    y = k(*xs)
    y = y[0] if isinstance(y, tuple) else y
    first = torch.autograd.grad((y * y).sum(), [x for x in xs if x.requires_grad], create_graph=True)
    second = torch.autograd.grad(sum(f.sum() for f in first), [x for x in xs if x.requires_grad], allow_unused=True)
    assert general, "a double backward took the plan's direct path"
    ref = [t.detach().clone().requires_grad_(n) for t, n in zip(base, needs)]
    fresh = tc.define(case.source)
    yr = fresh(*ref)
    yr = yr[0] if isinstance(yr, tuple) else yr
    first_r = torch.autograd.grad((yr * yr).sum(), [x for x in ref if x.requires_grad], create_graph=True)
    second_r = torch.autograd.grad(sum(f.sum() for f in first_r), [x for x in ref if x.requires_grad],
                                   allow_unused=True)
    for a, b in zip(first, first_r):
        assert_close(a.detach().numpy(), b.detach().numpy(), terms=terms)
    for a, b in zip(second, second_r):
        assert (a is None) == (b is None)
        if a is not None:
            assert_close(a.numpy(), b.numpy(), terms=terms)


@pytest.mark.cpu
def test_tensors_that_are_not_strided_are_refused_on_every_call() -> None:
    """Sparse and mkldnn tensors have no strided storage to run at: a located error, on the first
    call and after a call on a dense tensor of the same shape (the repeated-call path), for a def and
    for a short form."""
    k = tc.define("def inc(float(N) A) -> (B) { B(i) = A(i) + 1.0 }")
    dense = torch.arange(4, dtype=torch.float32)
    odd = [dense.to_sparse()] + ([dense.to_mkldnn()] if torch.backends.mkldnn.is_available() else [])
    for a in odd:
        with pytest.raises(tc.TcArgumentError, match="strided") as e:
            k(a)
        assert e.value.location is not None and e.value.location.line == 1
    np.testing.assert_array_equal(k(dense).numpy(), [1, 2, 3, 4])
    for a in odd:
        with pytest.raises(tc.TcArgumentError, match="strided"):
            k(a)
        with pytest.raises(tc.TcArgumentError, match="strided"):
            k(a.requires_grad_(True) if a.is_sparse else a)
    short = tc.define("B(i) = A(i) * 2.0")(lambda A: None)
    np.testing.assert_array_equal(short(dense).numpy(), [0, 2, 4, 6])
    with pytest.raises(tc.TcArgumentError, match="argument 1 is a sparse_coo tensor"):
        short(dense.to_sparse())


@pytest.mark.cpu
def test_repeated_calls_of_a_def_with_temporary_buffers_run_at_their_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel whose temporaries need buffers (a row sum kept across a loop) takes the address
    path too: each call makes its own buffers, so calls on different rows, and the backward def
    (which has temporaries of its own), give the right numbers."""
    from tcdsl import compiler

    k = tc.define("def rownorm(double(N, M) A) -> (B) {\n  s(i) +=! A(i, r_j)\n  B(i, j) = A(i, j) / s(i)\n}")
    calls = []
    run_at = compiler.CKernel.run_at
    monkeypatch.setattr(compiler.CKernel, "run_at", lambda self, inputs: calls.append(self) or run_at(self, inputs))
    big = torch.rand(20, 7, dtype=torch.float64) + 0.5
    for lo in (0, 3, 9, 13):
        A = big[lo:lo + 6]
        a = A.numpy()
        np.testing.assert_allclose(k(A).numpy(), a / a.sum(axis=1, keepdims=True), rtol=1e-14)
    temps = [c for c in calls if c._temp_makers]
    assert len(temps) >= 3, "calls on tensors with a kernel that has temporaries skipped the address path"
    for _ in range(3):
        A = (torch.rand(6, 7, dtype=torch.float64) + 0.5).requires_grad_(True)
        g = torch.rand(6, 7, dtype=torch.float64)
        k(A).backward(g)
        a, gn = _np(A), g.numpy()
        s = a.sum(axis=1, keepdims=True)
        want = gn / s - (gn * a).sum(axis=1, keepdims=True) / s ** 2
        np.testing.assert_allclose(_np(A.grad), want, rtol=1e-12, atol=1e-14)


@pytest.mark.cpu
def test_torch_compile() -> None:
    mlp = tc.define(next(c for c in CASES if c.name == "mlp").source)
    ln = tc.define(next(c for c in CASES if c.name == "layernorm").source)
    torch.manual_seed(0)
    X = torch.randn(3, 4, dtype=torch.float64)
    W1 = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    B1 = torch.randn(5, dtype=torch.float64, requires_grad=True)
    W2 = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    B2 = torch.randn(2, dtype=torch.float64, requires_grad=True)
    G = torch.randn(2, dtype=torch.float64, requires_grad=True)
    Bt = torch.randn(2, dtype=torch.float64)

    def model(x):
        return (ln(mlp(x, W1, B1, W2, B2), G, Bt) ** 2).sum()

    def reference(x):
        h = torch.relu(x @ W1.t() + B1) @ W2.t() + B2
        return (torch.nn.functional.layer_norm(h, (2,), G, Bt, eps=1e-5) ** 2).sum()

    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(X)
    got.backward()
    grads = [p.grad.clone() for p in (W1, B1, W2, B2, G)]
    for p in (W1, B1, W2, B2, G):
        p.grad = None
    want = reference(X)
    want.backward()
    # A layer norm over 2 features makes the loss almost constant in h: its gradients are small sums
    # of large terms, |dL/dh| <= top without cancellation, and the backward's terms move by top/sigma
    # per unit of h's own rounding (h_abs: the sums of |terms| of h). Errors scale with those.
    x, w1, b1, w2, b2, gain = (np.abs(_np(t)) for t in (X, W1, B1, W2, B2, G))
    h_abs = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    h = _np(torch.relu(X @ W1.t() + B1) @ W2.t() + B2)
    sigma = np.sqrt(h.var(axis=1) + 1e-5).min()
    top = 2 * np.abs(_np(torch.nn.functional.layer_norm(torch.from_numpy(h), (2,), G, Bt, eps=1e-5))).max() \
        * gain.max() / sigma
    below = max(1.0, w2.max() * x.max(), w2.max(), np.maximum(x @ w1.T + b1, 0).max(), h_abs.max())
    terms = _terms(X, W1, B1, W2, B2, G, Bt)
    assert_close(_np(got), _np(want), terms=terms, scale=top * h_abs.max())
    for g, p in zip(grads, (W1, B1, W2, B2, G)):
        assert_close(_np(g), _np(p.grad), terms=terms, scale=top * (1 + h_abs.max() / sigma) * below)


BWD_SCALED = """
def matmul_grad(double(M, K) A, double(K, N) B, double(M, N) d_C) -> (d_A, d_B) {
  d_A(m, k) +=! 2.0 * d_C(m, n) * B(k, n)
  d_B(k, n) +=! 3.0 * d_C(m, n) * A(m, k)
}
"""


@pytest.mark.cpu
def test_user_supplied_backward() -> None:
    src = CASES[0].source
    k = tc.define(src, backward=BWD_SCALED.replace("2.0 * ", "").replace("3.0 * ", ""))
    assert k.backward_source().startswith("def matmul_grad(float64(M, K) A, float64(K, N) B, float64(M, N) d_C)")
    args = _tensors(CASES[0])
    assert torch.autograd.gradcheck(k, tuple(args))
    scaled = tc.define(src, backward=BWD_SCALED)  # used as given, even when wrong
    A, B = _tensors(CASES[0])
    scaled(A, B).sum().backward()
    ones = np.ones((3, 2))
    assert_sum_close(A.grad.numpy(), lambda B: 2 * ones @ B.T, _np(B), terms=2)
    assert_sum_close(B.grad.numpy(), lambda A: 3 * A.T @ ones, _np(A), terms=3)


@pytest.mark.cpu
def test_module_trains() -> None:
    src = ("def cbr(float(N, C, H, W) I, float(F, C, 3, 3) Wt, float(F) Bias) -> (O) {\n"
           "  Conv(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W\n"
           "  O(n, f, h, w) = fmax(Conv(n, f, h, w) + Bias(f), 0.0)\n"
           "}")
    torch.manual_seed(0)
    m = TcModule(src, Wt=(3, 2, 3, 3), Bias=torch.full((3,), 0.1))
    assert sorted(n for n, _ in m.named_parameters()) == ["Bias", "Wt"] and m.input_names == ["I"]
    x = torch.randn(2, 2, 5, 4)
    y = m(x)
    ref = torch.relu(torch.nn.functional.conv2d(x, m.Wt, m.Bias, padding=1))

    def conv_bias(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        return torch.nn.functional.conv2d(*map(torch.from_numpy, (x, w, b)), padding=1).numpy()

    # the forward: 2*3*3 products and the bias; relu changes no bound
    y_terms = conv_bias(*(np.abs(_np(t)).astype(np.float64) for t in (x, m.Wt, m.Bias)))
    assert_close(_np(y), _np(ref), terms=19, scale=y_terms)
    # d(sum y^2)/dWt: 2*5*4 terms 2 y x, each y within the forward's bound: y_terms bounds |y| and its error
    g_terms = torch.nn.grad.conv2d_weight(torch.from_numpy(np.abs(_np(x)).astype(np.float64)), tuple(m.Wt.shape),
                                          torch.from_numpy(2 * y_terms), padding=1).numpy()
    y.square().sum().backward()
    wg, bg = m.Wt.grad.clone(), m.Bias.grad.clone()
    m.zero_grad()
    ref.square().sum().backward()
    assert_close(_np(wg), _np(m.Wt.grad), terms=40 + 19, scale=g_terms)
    assert_close(_np(bg), _np(m.Bias.grad), terms=40 + 19, scale=2 * y_terms.sum(axis=(0, 2, 3)))
    m.zero_grad()
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)  # parameters as kernel arguments
    out = compiled(x)
    assert_close(_np(out), _np(y), terms=19, scale=y_terms)
    out.square().sum().backward()
    assert_close(_np(m.Wt.grad), _np(wg), terms=40 + 19, scale=g_terms)


@pytest.mark.cpu
def test_short_form_takes_tensors() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    A = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    B = torch.rand(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(matmul, (A, B))
    assert "d_A(i, k) +=! (d_C(i, j) * B(k, j))" in matmul.backward_source(A.detach(), B.detach())


@pytest.mark.cpu
def test_short_form_repeated_calls_on_tensors_skip_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors of shapes and dtypes a short form has seen go straight to the def made for them:
    each call's numbers, gradients when they require grad, and a sparse tensor of a seen shape is
    still refused."""
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    g = torch.Generator().manual_seed(3)
    A, B = torch.rand(3, 4, generator=g), torch.rand(4, 5, generator=g)
    assert_sum_close(matmul(A, B).numpy(), np.matmul, A.numpy(), B.numpy(), terms=4)
    monkeypatch.setattr(type(matmul), "kernel", lambda self, *a: pytest.fail("signature made again"))
    for _ in range(2):
        A2 = torch.rand(3, 4, generator=g, requires_grad=True)
        C = matmul(A2, B)
        assert_sum_close(C.detach().numpy(), np.matmul, A2.detach().numpy(), B.numpy(), terms=4)
        C.backward(torch.ones(3, 5))
        assert_sum_close(A2.grad.numpy(), np.matmul, np.ones((3, 5), np.float32), B.numpy().T, terms=5)
    monkeypatch.undo()
    with pytest.raises(tc.TcArgumentError, match="argument 1 is a sparse_coo tensor"):
        matmul(A.to_sparse(), B)


def _located(exc: pytest.ExceptionInfo, line: int, col: int, fragment: str) -> None:
    loc = exc.value.location
    assert loc is not None and (loc.line, loc.col) == (line, col), loc
    assert fragment in exc.value.message


def test_dtype_device_and_out_errors() -> None:
    k = tc.define("def mm(double(M, K) A,\n       double(K, N) B) -> (C) {\n  C(m, n) +=! A(m, k) * B(k, n)\n}")
    A = torch.rand(3, 4, dtype=torch.float64)
    with pytest.raises(TcArgumentError) as exc:
        k(A, torch.rand(4, 2))
    _located(exc, 2, 8, "'B' is declared float64 but the tensor has dtype torch.float32")
    with pytest.raises(TcArgumentError) as exc:
        k(A, torch.empty(4, 2, dtype=torch.float64, device="meta"))
    _located(exc, 2, 8, "'B' is on meta; tcdsl runs torch tensors on the CPU")
    with pytest.raises(TcArgumentError) as exc:
        k(A.requires_grad_(True), torch.rand(4, 2, dtype=torch.float64), out=torch.empty(3, 2, dtype=torch.float64))
    _located(exc, 1, 5, "out= records no gradient")


@pytest.mark.cpu
def test_save_choices_give_the_same_gradients() -> None:
    case = next(c for c in CASES if c.name == "softmax")
    X = _tensors(case)[0]
    grads = []
    for save in (None, (), {"e": True}):
        k = tc.define(case.source, save=save)
        (k(X) * torch.arange(5.0, dtype=torch.float64)).sum().backward()
        grads.append(X.grad.clone())
        X.grad = None
    terms = 2 * _terms(X)  # the forward's sums and the backward's
    for g in grads[1:]:
        assert_close(_np(g), _np(grads[0]), terms=terms)
    ref = X.detach().clone().requires_grad_(True)
    (torch.softmax(ref, 1) * torch.arange(5.0, dtype=torch.float64)).sum().backward()
    assert_close(_np(grads[0]), _np(ref.grad), terms=terms)


def test_product_reduction_fails_at_the_call_that_needs_a_gradient() -> None:
    k = tc.define("def p(double(M, N) A) -> (P) {\n  P(i) *=! A(i, j)\n}")
    A = torch.rand(2, 3, dtype=torch.float64)
    assert_close(_np(k(A, backend="numpy")), _np(A.prod(1)), terms=3, scale=_np(A.prod(1)))  # no gradient needed
    with pytest.raises(tc.TcGradientError) as exc:
        k(A.requires_grad_(True), backend="numpy")
    _located(exc, 2, 3, "a product reduction")


@pytest.mark.cpu
def test_library_with_backward_defs_by_name() -> None:
    lib = tc.define("def twice(double(N) A) -> (B) { B(i) = 2.0 * A(i) }\n"
                    "def square(double(N) A) -> (B) { B(i) = A(i) * A(i) }",
                    backward="def twice_grad(double(N) A, double(N) d_B) -> (d_A) { d_A(i) = 5.0 * d_B(i) }")
    A = torch.rand(4, dtype=torch.float64, requires_grad=True)
    lib.twice(A).sum().backward()
    torch.testing.assert_close(A.grad, torch.full((4,), 5.0, dtype=torch.float64))  # the given one
    A.grad = None
    lib.square(A).sum().backward()
    torch.testing.assert_close(A.grad, 2 * A.detach())  # derived


@pytest.mark.cpu
@pytest.mark.parametrize("name", ["softmax", "gather", "matmul"])
def test_double_backward(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    k = tc.define(case.source)
    assert torch.autograd.gradgradcheck(k, tuple(_tensors(case)), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.cpu
def test_module_copies_and_saves() -> None:
    import copy
    import io

    m = TcModule("def lin(double(B, K) X, double(N, K) Wt) -> (Y) { Y(b, n) +=! X(b, k) * Wt(n, k) }", Wt=(3, 4))
    x = torch.rand(2, 4, dtype=torch.float64)
    twin = copy.deepcopy(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (twin, loaded):
        assert_sum_close(_np(other(x)), lambda x, w: x @ w.T, x.numpy(), _np(m.Wt), terms=4)
        assert other.Wt is not m.Wt and other.kernel is not m.kernel


def test_backward_runs_on_the_kernels_backend() -> None:
    from tcdsl import torch_ops

    k = tc.define(CASES[0].source, backend="numpy")  # the interpreter: nothing is compiled
    A, B = _tensors(CASES[0])
    k(A, B).sum().backward()
    assert_sum_close(A.grad.numpy(), lambda B: np.ones((3, 2)) @ B.T, _np(B), terms=2)
    entries = [torch_ops._REGISTRY[key] for key in k._torch_backward_keys.values()]
    assert entries and all(e.kernel.backend == "numpy" and e.kernel.compile_count == 0 for e in entries)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not has_cuda(), reason="no CUDA device with cupy")
def test_gradients_of_cuda_tensors_run_on_the_cuda_backend():  # pragma: no cover - runs where a GPU is
    k = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }")
    A = torch.randn(33, 17, device="cuda", requires_grad=True)
    B = torch.randn(17, 9, device="cuda", requires_grad=True)
    C = k(A, B)
    assert C.is_cuda
    C.sum().backward()
    assert_sum_close(_np(C), np.matmul, _np(A), _np(B), terms=17)
    assert_sum_close(_np(A.grad), lambda B: np.ones((33, 9)) @ B.T, _np(B), terms=9)


_EXPORT = '''
import numpy as np, torch, tcdsl as tc
k = tc.define("""def lin(float(B,M) I, float(N,M) W, float(N) Bias) -> (O) {
    O(b, n) +=! I(b, r_m) * W(n, r_m)
    O(b, n) = fmax(O(b, n) + Bias(n), 0.0)
}""")
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.W = torch.nn.Parameter(torch.randn(6, 5, generator=g))
        self.b = torch.nn.Parameter(torch.randn(6, generator=g))
    def forward(self, x):
        return k(x, self.W, self.b) * 2
m, x = M(), torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
ep = torch.export.export(m, (x,))
assert any("tcdsl.forward" in str(n.target) for n in ep.graph.nodes)
torch.export.save(ep, "prog.pt2")
torch.save({"x": x, "y": m(x).detach()}, "io.pt")
'''
_LOAD = '''
import {first}, {second}
ep = torch.export.load("prog.pt2")
d = torch.load("io.pt")
y = ep.module()(d["x"])
assert torch.equal(y, d["y"]), (y, d["y"])
print("ok")
'''


@pytest.mark.parametrize("order", [("torch", "tcdsl"), ("tcdsl", "torch")])
def test_an_exported_program_runs_in_a_new_process(tmp_path: Path, order: tuple[str, str]) -> None:
    """The op's key is the def's text (not a per-process counter), and ``import tcdsl`` registers
    the ops (now, or right after torch is imported): a program exported in one process loads and
    runs in another, rebuilding the kernel from its text, with the same numbers."""
    import subprocess

    env = {**__import__("os").environ, "TCDSL_CACHE_DIR": str(tmp_path / "cache")}
    run = [sys.executable, "-c"]
    subprocess.run([*run, _EXPORT], cwd=tmp_path, env=env, check=True, timeout=300)
    out = subprocess.run([*run, _LOAD.format(first=order[0], second=order[1])], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_short_form_kernels_compile_without_graph_breaks() -> None:
    """Under torch.compile(fullgraph=True) a short-form kernel finds its def from the tensors' dtypes
    and shapes (no tensor is looked into while tracing), forward and backward."""
    mm = tc.define("C(i, j) +=! A(i, k) * B(k, j)")(lambda A, B: None)
    f = torch.compile(lambda a, b: mm(a, b).relu() + 1, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(8, 5, generator=g, requires_grad=True)
    b = torch.randn(5, 3, generator=g, requires_grad=True)
    y = f(a, b)
    want = (a.detach() @ b.detach()).relu() + 1
    assert_sum_close(_np(y) - 1, lambda A, B: np.maximum(A @ B, 0), _np(a), _np(b), terms=5)
    y.sum().backward()
    mask = (want > 1).float()
    assert_sum_close(a.grad.numpy(), lambda M, B: M @ B.T, mask.numpy(), _np(b), terms=3)


@pytest.mark.cpu
def test_gradcheck_in_float32_points_to_double() -> None:
    import warnings

    src = "def mms(float(M,K) A, float(K,N) B) -> (C) { T(m,n) +=! A(m,r_k) * B(r_k,n)\n C(m,n) = T(m,n) * float(2) }"
    k = tc.define(src, save=["T"])
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 4, generator=g, requires_grad=True)
    B = torch.randn(4, 5, generator=g, requires_grad=True)
    with warnings.catch_warnings(record=True) as seen:  # torch warns too (UserWarning): record them all
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="Jacobian mismatch"):  # GradcheckError
            torch.autograd.gradcheck(k, (A, B))
    told = [w for w in seen if issubclass(w.category, tc.TcWarning)]
    assert len(told) == 1 and "mms.double()" in str(told[0].message) and "float32" in str(told[0].message)
    with pytest.raises(TcArgumentError, match=r"\.to\(torch\.float32\), or call mms\.double\(\)"):
        k(A.double(), B.double())
    with pytest.raises(TcArgumentError, match=r"astype\(np\.float32\), or call mms\.double\(\)"):
        k(A.detach().double().numpy(), B.detach().double().numpy())
    # the float64 twin: every type and cast widened, the save choice kept; gradcheck passes
    k64 = k.double()
    assert str(k64).startswith("def mms(float64(M, K) A, float64(K, N) B) -> (C)") and "float64(2)" in str(k64)
    head = k.backward_source().splitlines()[0]
    assert k64._save == ["T"]  # the save choice is kept
    assert k64.backward_source().splitlines()[0] == head.replace("float32", "float64")
    assert "float32" not in k64.backward_source()
    A64, B64 = (x.detach().double().requires_grad_() for x in (A, B))
    assert torch.autograd.gradcheck(k64, (A64, B64))
    # a hand-written backward is widened with it
    user = tc.define(CASES[0].source.replace("double", "float"), backward=BWD_SCALED.replace("double", "float"))
    assert user.double().backward_source().startswith("def matmul_grad(float64(M, K) A, float64(K, N) B")


@pytest.mark.cpu
def test_the_training_example_trains_and_times_both_models(tmp_path: Path) -> None:
    """``examples/train_conv.py`` trains its tcdsl layer (it exits non-zero unless the loss halves)
    and prints the time per step of it and of torch's own layers."""
    import os
    import subprocess

    script = Path(__file__).resolve().parent.parent / "examples" / "train_conv.py"
    env = {**os.environ, "TCDSL_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "def conv_bias_relu_grad(" in run.stdout  # the derived backward, printed
    ratio = float(run.stdout.split("tcdsl trains at ")[1].split("x")[0])
    assert ratio > 0 and "held-out accuracy" in run.stdout, run.stdout
