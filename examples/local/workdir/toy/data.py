import torch


def batches(rank: int, world: int, steps: int, size: int = 32):
    """Points on y = 3x + 1 with a little noise; each rank draws its own."""
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.rand(size, 1, generator=g) * 2 - 1
        yield x, 3 * x + 1 + 0.01 * torch.randn(size, 1, generator=g)
