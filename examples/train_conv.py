"""Train a tiny convolutional classifier whose conv + bias + relu layer is a tcdsl kernel.

The layer is one TC def; its backward def is derived by tcdsl (printed below) and runs through
PyTorch autograd. The task: tell 8x8 images with a horizontal bar from images with a vertical
one. Prints the loss as it goes down and exits non-zero if it does not. Then the same model with
torch's own layers (``nn.Conv2d`` and ``relu``) trains on the same batches, and the time per step
of each is printed (the first steps, which compile tcdsl's kernels, are not counted).

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


def train(conv: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], report: bool
          ) -> tuple[list[float], float, torch.nn.Module, torch.nn.Module]:
    """Train ``conv`` and a linear head on ``batches``; the losses, and the seconds per step after
    the first WARMUP steps."""
    torch.manual_seed(0)
    head = torch.nn.Linear(4 * 8 * 8, 2)
    opt = torch.optim.Adam([*conv.parameters(), *head.parameters()], lr=0.02)
    losses = []
    start = 0.0
    for step, (x, y) in enumerate(batches):
        if step == WARMUP:
            start = time.perf_counter()
        logits = head(conv(x).flatten(1))
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if report and (step % 10 == 0 or step == len(batches) - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}")
    return losses, (time.perf_counter() - start) / (len(batches) - WARMUP), conv, head


WARMUP = 5  # steps not timed: tcdsl compiles its kernels in the first


def main() -> int:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    batches = [batch(32, gen) for _ in range(60)]
    conv = TcModule(CONV_BIAS_RELU, Wt=(4, 1, 3, 3), Bias=(4,))
    initial = conv.Wt.detach().clone(), conv.Bias.detach().clone()
    print("derived backward of the tcdsl layer:")
    print(conv.kernel.backward_source())
    losses, tc_step, conv, head = train(conv, batches, report=True)
    x, y = batch(256, gen)
    with torch.no_grad():
        acc = (head(conv(x).flatten(1)).argmax(1) == y).float().mean().item()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"mean loss of the first 5 steps {first:.4f}, of the last 5 {last:.4f}; held-out accuracy {acc:.2f}")

    # the same model with torch's own layers, from the same initial weights, on the same batches
    torch_conv = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU())
    with torch.no_grad():
        torch_conv[0].weight.copy_(initial[0])
        torch_conv[0].bias.copy_(initial[1])
    torch_losses, torch_step, _, _ = train(torch_conv, batches, report=False)
    print(f"time per training step (steps {WARMUP}-{len(batches) - 1}): tcdsl layer {tc_step * 1e3:.2f} ms, "
          f"torch's nn.Conv2d {torch_step * 1e3:.2f} ms: tcdsl trains at {torch_step / tc_step:.2f}x torch's speed; "
          f"final loss {last:.4f} against {sum(torch_losses[-5:]) / 5:.4f}")
    return 0 if last < 0.5 * first else 1


if __name__ == "__main__":
    sys.exit(main())
