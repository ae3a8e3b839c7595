#!/usr/bin/python3
"""The PyTorch twin of muster-train's single mode, for bench/trainer: the same
layers (nn.Linear + ReLU), softmax cross-entropy, SGD with momentum, batch and
data (MNIST from the same IDX files), on one thread. Prints samples/s of the
training steps (data already in memory, as muster-train has it).

With --epochs E it trains as muster-train does by default instead: E passes,
reshuffled each epoch, the last partial batch dropped, the learning rate
decayed along a half cosine per step (--lr-schedule), and prints the
test accuracy too (tests/slurm compares muster's PS training with it)."""
import argparse
import json
import math
import time

import numpy as np
import torch


def load(path):
    raw = np.fromfile(path, dtype=np.uint8)
    return raw[16:].reshape(-1, 784).astype(np.float32) / 255.0


def train_epochs(args, model, opt, loss_fn, x, y):
    nb = x.shape[0] // args.batch
    total = args.epochs * nb
    sched = None
    if (args.lr_schedule or "cosine") == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / total)))
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(x.shape[0])
        for b in range(nb):
            idx = perm[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            if sched:
                sched.step()
    t = time.perf_counter() - t0
    xt = torch.from_numpy(load(args.data + "/t10k-images-idx3-ubyte"))
    yt = torch.from_numpy(np.fromfile(args.data + "/t10k-labels-idx1-ubyte", dtype=np.uint8)[8:]
                          .astype(np.int64))
    with torch.no_grad():
        out = model(xt)
        acc = (out.argmax(1) == yt).float().mean()
        test_loss = loss_fn(out, yt)
    print(json.dumps({"framework": "pytorch " + torch.__version__, "batch": args.batch,
                      "epochs": args.epochs, "steps": total,
                      "samples_per_s": total * args.batch / t, "final_loss": float(loss),
                      "test_accuracy": round(float(acc), 4), "test_loss": float(test_loss)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--lr-schedule", choices=("cosine", "constant"), default=None)
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
    if args.epochs > 0:
        return train_epochs(args, model, opt, loss_fn, x, y)
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
