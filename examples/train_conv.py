"""Train a tiny convolutional classifier whose conv + bias + relu layer is a tcdsl kernel.

The layer is one TC def; its backward def is derived by tcdsl (printed below) and runs through
PyTorch autograd. The task: tell 8x8 images with a horizontal bar from images with a vertical
one. Prints the loss as it goes down and exits non-zero if it does not. The same model with
torch's own layers (``nn.Conv2d`` and ``relu``) trains on the same batches, a step of each in turn,
and the median time per step of each is printed (the first steps, which compile tcdsl's kernels,
are not counted).

Run with ``.venv/bin/python examples/train_conv.py``.
"""

from __future__ import annotations

import statistics
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


class Trainer:
    """``conv`` and a linear head, trained by Adam one batch at a time; each step's loss and seconds."""

    def __init__(self, conv: torch.nn.Module) -> None:
        torch.manual_seed(0)  # the same head for every model
        self.conv, self.head = conv, torch.nn.Linear(4 * 8 * 8, 2)
        self.opt = torch.optim.Adam([*conv.parameters(), *self.head.parameters()], lr=0.02)
        self.losses: list[float] = []
        self.seconds: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(self.head(self.conv(x).flatten(1)), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.seconds.append(time.perf_counter() - start)
        self.losses.append(loss.item())
        return self.losses[-1]

    def step_time(self) -> float:
        """The median seconds of a step after the first WARMUP (tcdsl compiles its kernels in the first)."""
        return statistics.median(self.seconds[WARMUP:])


WARMUP = 5  # steps not timed


def main() -> int:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    batches = [batch(32, gen) for _ in range(200)]
    conv = TcModule(CONV_BIAS_RELU, Wt=(4, 1, 3, 3), Bias=(4,))
    print("derived backward of the tcdsl layer:")
    print(conv.kernel.backward_source())
    # the same model with torch's own layers, from the same initial weights, trained on the same
    # batches step by step alongside (so that both see the same machine load)
    torch_conv = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU())
    with torch.no_grad():
        torch_conv[0].weight.copy_(conv.Wt)
        torch_conv[0].bias.copy_(conv.Bias)
    tc_run, torch_run = Trainer(conv), Trainer(torch_conv)
    for step, (x, y) in enumerate(batches):
        loss = tc_run.step(x, y)
        torch_run.step(x, y)
        if step % 20 == 0 or step == len(batches) - 1:
            print(f"step {step:3d}  loss {loss:.4f}")
    x, y = batch(256, gen)
    with torch.no_grad():
        acc = (tc_run.head(conv(x).flatten(1)).argmax(1) == y).float().mean().item()
    first, last = sum(tc_run.losses[:5]) / 5, sum(tc_run.losses[-5:]) / 5
    print(f"mean loss of the first 5 steps {first:.4f}, of the last 5 {last:.4f}; held-out accuracy {acc:.2f}")
    tc_step, torch_step = tc_run.step_time(), torch_run.step_time()
    print(f"time per training step (median of steps {WARMUP}-{len(batches) - 1}, taken in turns): tcdsl layer "
          f"{tc_step * 1e3:.3f} ms, torch's nn.Conv2d {torch_step * 1e3:.3f} ms: tcdsl trains at "
          f"{torch_step / tc_step:.2f}x torch's speed; final loss {last:.4f} against "
          f"{sum(torch_run.losses[-5:]) / 5:.4f}")
    return 0 if last < 0.5 * first else 1


if __name__ == "__main__":
    sys.exit(main())
