"""A PyTorch DistributedDataParallel job (gloo) for `muster run --mode exec`:
it reads torchrun's variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK),
trains a small model on a fixed synthetic problem, and prints what it saw."""
import json
import os

import torch
import torch.distributed as dist

# Each worker has its own loopback address: gloo must use that interface.
if os.environ.get("MASTER_ADDR", "").startswith("127."):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {world} (RANK={os.environ['RANK']}, LOCAL_RANK={os.environ['LOCAL_RANK']}, "
      f"worker {os.environ.get('MUSTER_WORKER_ID')} at {os.environ.get('MUSTER_IP_ADDRESS')})",
      flush=True)

torch.manual_seed(0)
x = torch.randn(512, 10)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
loss_fn = torch.nn.BCEWithLogitsLoss()
shard = slice(rank * 512 // world, (rank + 1) * 512 // world)
for step in range(100):
    opt.zero_grad()
    loss = loss_fn(model(x[shard]), y[shard])
    loss.backward()
    opt.step()
# Every rank must hold the same weights after DDP's all-reduces.
w = model.module.weight.detach().clone()
others = [torch.zeros_like(w) for _ in range(world)]
dist.all_gather(others, w)
same = all(torch.equal(o, w) for o in others)
total = torch.tensor([float(loss)])
dist.all_reduce(total)
if rank == 0:
    print(json.dumps({"world_size": world, "mean_final_loss": float(total) / world,
                      "weights_equal_on_all_ranks": same}), flush=True)
dist.destroy_process_group()
