"""Train a tiny convolutional classifier whose conv + bias + relu layer is a tcdsl kernel.

The layer is one TC def; its backward def is derived by tcdsl (printed below) and runs through
PyTorch autograd. The task: tell 8x8 images with a horizontal bar from images with a vertical
one. Prints the loss as it goes down and exits non-zero if it does not.

Run with ``.venv/bin/python examples/train_conv.py``.
"""

from __future__ import annotations

import sys
import time

import torch

from tcdsl.nn import TcModule

CONV_BIAS_RELU = """
def conv_bias_relu(float(N, C, H, W) I, float(F, C, 3, 3) Wt, float(F) Bias) -> (O) {
    Conv(n, f, h, w) +=! I(n, c, h + kh - 1, w + kw - 1) * Wt(f, c, kh, kw) where h in 0:H, w in 0:W
    O(n, f, h, w) = fmax(Conv(n, f, h, w) + Bias(f), 0.0)
}
"""


def batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Images with one bar (row or column) plus noise; label 0 for horizontal, 1 for vertical."""
    labels = torch.randint(0, 2, (n,), generator=gen)
    pos = torch.randint(1, 7, (n,), generator=gen)
    x = 0.3 * torch.randn(n, 1, 8, 8, generator=gen)
    for i in range(n):
        if labels[i] == 0:
            x[i, 0, pos[i], :] += 1.0
        else:
            x[i, 0, :, pos[i]] += 1.0
    return x, labels


def main() -> int:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    conv = TcModule(CONV_BIAS_RELU, Wt=(4, 1, 3, 3), Bias=(4,))
    head = torch.nn.Linear(4 * 8 * 8, 2)
    print("derived backward of the tcdsl layer:")
    print(conv.kernel.backward_source())
    params = [*conv.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=0.02)
    start = time.perf_counter()
    losses = []
    for step in range(60):
        x, y = batch(32, gen)
        logits = head(conv(x).flatten(1))
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == 59:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    x, y = batch(256, gen)
    with torch.no_grad():
        acc = (head(conv(x).flatten(1)).argmax(1) == y).float().mean().item()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"mean loss of the first 5 steps {first:.4f}, of the last 5 {last:.4f}; held-out accuracy {acc:.2f}; "
          f"{time.perf_counter() - start:.1f} s")
    return 0 if last < 0.5 * first else 1


if __name__ == "__main__":
    sys.exit(main())
