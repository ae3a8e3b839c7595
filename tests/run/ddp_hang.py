"""A 2-rank PyTorch DistributedDataParallel job (gloo) for `muster run --mode
exec` whose rank 1 stops at step 5 in a sleep (on the first attempt only:
MUSTER_RESTART_COUNT 0), while rank 0 goes on into the step's all-reduce
and waits there for it: a hung rank, for the stall report to name. Each
rank logs its loss every step with the Python client's log_metrics()."""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk",
                                "python"))
import muster  # noqa: E402

if os.environ.get("MASTER_ADDR", "").startswith("127."):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
first_attempt = os.environ.get("MUSTER_RESTART_COUNT", "0") == "0"


def stuck():
    print(f"rank {rank} hangs at step 5 at {time.time():.3f}", flush=True)
    time.sleep(3600)


torch.manual_seed(0)
x = torch.randn(256, 10)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
loss_fn = torch.nn.BCEWithLogitsLoss()
shard = slice(rank * 256 // world, (rank + 1) * 256 // world)
for step in range(20):
    if step == 5 and rank == 1 and first_attempt:
        stuck()
    opt.zero_grad()
    loss = loss_fn(model(x[shard]), y[shard])
    loss.backward()
    opt.step()
    muster.log_metrics(step, loss=float(loss))
    print(f"rank {rank} step {step} loss {float(loss):.4f}", flush=True)
    time.sleep(0.2)
muster.flush_metrics()
if rank == 0:
    print('{"steps": 20}', flush=True)
dist.destroy_process_group()
