"""``torch.vmap`` over tcdsl ops: the batched def (``core.batching``: a leading index on every tensor
that carries the batch), one kernel call per batch, results and gradients against torch's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tcdsl as tc  # noqa: E402
from tcdsl import torch_ops  # noqa: E402
from tcdsl.core.batching import batched, carried  # noqa: E402
from tcdsl.core.printer import definition  # noqa: E402
from tcdsl.grammar import parse  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tolerance import assert_close  # noqa: E402

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,r_k) * B(r_k,n) }"
CHAIN = """def chain(float(M,K) A, float(K,N) B, float s) -> (C, T, S) {
  T(m, k) = A(m, k) * s
  C(m, n) +=! T(m, r_k) * B(r_k, n)
  S +=! C(r_m, r_n)
}"""


def test_batched_def_text_and_what_carries_the_batch() -> None:
    d = parse(CHAIN).defs[0]
    bd, carry = batched(d, ["B"])
    assert carry == {"B", "C", "S"}  # T reads neither B nor anything made from it: shared by the batch
    assert definition(bd) == (
        "def chain(float32(M, K) A, float32(VMAP_B, K, N) B, float32 s) -> (C, T, S) {\n"
        "  T(m, k) = A(m, k) * s\n"
        "  C(vmap_b, m, n) +=! T(m, r_k) * B(vmap_b, r_k, n) where vmap_b in 0:VMAP_B\n"
        "  S(vmap_b) +=! C(vmap_b, r_m, r_n) where vmap_b in 0:VMAP_B\n"
        "}")
    assert carried(d, ["s"]) == {"s", "T", "C", "S"}
    # a def that already uses the names gets fresh ones
    taken = parse("def f(float(VMAP_B) vmap_b) -> (O) { O(i) = vmap_b(i) * 2 }").defs[0]
    text = definition(batched(taken, ["vmap_b"])[0])
    assert "float32(VMAP_B1, VMAP_B) vmap_b" in text and "O(vmap_b1, i) = vmap_b(vmap_b1, i) * 2" in text
    with pytest.raises(ValueError, match="no input X"):
        batched(d, ["X"])


@pytest.mark.cpu
@pytest.mark.parametrize("in_dims", [(0, None), (None, 0), (0, 0), (1, None), (2, 0)])
def test_vmap_is_one_kernel_call(in_dims: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    mm = tc.define(MM)
    g = torch.Generator().manual_seed(0)
    base = {"A": (3, 4), "B": (4, 6)}
    args = []
    for shape, d in zip(base.values(), in_dims):
        shape = list(shape)
        if d is not None:
            shape.insert(d, 5)
        args.append(torch.randn(*shape, generator=g))
    calls = []
    run = torch_ops._run
    monkeypatch.setattr(torch_ops, "_run", lambda e, a: calls.append(e) or run(e, a))
    got = torch.vmap(mm, in_dims=in_dims)(*args)
    a = args[0].movedim(in_dims[0], 0) if in_dims[0] is not None else args[0]
    b = args[1].movedim(in_dims[1], 0) if in_dims[1] is not None else args[1]
    assert got.shape == (5, 3, 6)
    assert_close(got.numpy(), (a.double() @ b.double()).numpy(), terms=4)
    assert len(calls) == 1 and "VMAP_B" in definition(calls[0].kernel.checked.source)


@pytest.mark.cpu
def test_nested_vmap_scalars_and_unbatched_outputs() -> None:
    k = tc.define(CHAIN)
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(2, 3, 4, 5, generator=g), torch.randn(5, 6, generator=g)
    s = torch.tensor([0.5, -2.0, 3.0])
    # outer over A's first dim, inner over A's second and s
    C, T, S = torch.vmap(torch.vmap(k, in_dims=(0, None, 0)), in_dims=(0, None, None))(A, B, s)
    want_T = A.double() * s.double()[None, :, None, None]
    want_C = want_T @ B.double()
    assert C.shape == (2, 3, 4, 6) and T.shape == (2, 3, 4, 5) and S.shape == (2, 3)
    assert_close(T.numpy(), want_T.numpy(), terms=1)
    assert_close(C.numpy(), want_C.numpy(), terms=5)
    assert_close(S.numpy(), want_C.sum((-1, -2)).numpy(), terms=5 * 24)
    # only B batched: T depends on no batched input and comes back the same for every item
    Bb = torch.randn(4, 5, 6, generator=g)
    C, T, S = torch.vmap(k, in_dims=(None, 0, None))(A[0, 0], Bb, torch.tensor(2.0))
    assert T.shape == (4, 4, 5) and torch.equal(T[0], T[3])
    assert_close(C.numpy(), ((A[0, 0].double() * 2) @ Bb.double()).numpy(), terms=5)


@pytest.mark.cpu
def test_gradients_through_vmap_match_torch() -> None:
    mm = tc.define(MM.replace("float", "double"))
    g = torch.Generator().manual_seed(2)
    A = torch.randn(5, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    B = torch.randn(4, 6, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(5, 3, 6, dtype=torch.float64, generator=g)
    (torch.vmap(mm, in_dims=(0, None))(A, B) * W).sum().backward()
    A2, B2 = A.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
    ((A2 @ B2) * W).sum().backward()
    assert_close(A.grad.numpy(), A2.grad.numpy(), terms=6)
    assert_close(B.grad.numpy(), B2.grad.numpy(), terms=5 * 3)


@pytest.mark.cpu
def test_short_form_and_softmax_under_vmap() -> None:
    @tc.define("C(i, j) +=! A(i, k) * B(k, j)")
    def matmul(A, B): ...

    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(5, 3, 4, generator=g), torch.randn(4, 6, generator=g)
    assert_close(torch.vmap(matmul, in_dims=(0, None))(A, B).numpy(), (A.double() @ B.double()).numpy(), terms=4)
    sm = tc.define("""def softmax(float(N, D) X) -> (Y, mx, s) {
      mx(n) max=! X(n, r_d)
      Y(n, d) = exp(X(n, d) - mx(n))
      s(n) +=! Y(n, r_d)
      Y(n, d) = Y(n, d) / s(n)
    }""")
    X = torch.randn(7, 4, 9, generator=g)
    Y, mx, _ = torch.vmap(sm)(X)
    assert torch.equal(mx, X.amax(-1))
    assert_close(Y.numpy(), torch.softmax(X.double(), -1).numpy(), terms=9)
    np.testing.assert_array_equal(Y.shape, X.shape)
