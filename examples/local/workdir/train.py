"""A small data-parallel fit of a line, with the model and data from the `toy` package beside this file."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from toy.data import batches
from toy.model import Line

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(Line())
opt = torch.optim.SGD(model.parameters(), lr=0.5)
first = last = None
for x, y in batches(rank, world, steps=50):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    first = loss.item() if first is None else first
    last = loss.item()
w = model.module.weight.item()
print(f"rank {rank} of {world}: loss {first:.3f} -> {last:.4f}, slope {w:.2f} (the data's is 3.00)", flush=True)
dist.destroy_process_group()
