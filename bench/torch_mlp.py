#!/usr/bin/python3
"""The PyTorch twin of muster-train's single mode, for bench/trainer: the same
layers (nn.Linear + ReLU), softmax cross-entropy, SGD with momentum, batch and
data (MNIST from the same IDX files), on one thread. Prints samples/s of the
training steps (data already in memory, as muster-train has it)."""
import argparse
import json
import time

import numpy as np
import torch


def load(path):
    raw = np.fromfile(path, dtype=np.uint8)
    return raw[16:].reshape(-1, 784).astype(np.float32) / 255.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    # As muster-train does: subnormal floats flushed to zero (otherwise the
    # decaying momentum of never-used weights slows every step).
    torch.set_flush_denormal(True)
    torch.manual_seed(1)
    x = torch.from_numpy(load(args.data + "/train-images-idx3-ubyte"))
    y = torch.from_numpy(np.fromfile(args.data + "/train-labels-idx1-ubyte", dtype=np.uint8)[8:]
                         .astype(np.int64))
    sizes = [int(s) for s in args.layers.split(",")]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    perm = torch.randperm(x.shape[0])
    nb = x.shape[0] // args.batch

    def step(i):
        idx = perm[(i % nb) * args.batch:(i % nb + 1) * args.batch]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    for i in range(20):  # warm-up
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    t = time.perf_counter() - t0
    print(json.dumps({"framework": "pytorch " + torch.__version__, "batch": args.batch,
                      "samples_per_s": args.steps * args.batch / t, "final_loss": float(loss),
                      "blas": torch.__config__.show().count("OpenBLAS") > 0}))


if __name__ == "__main__":
    main()
