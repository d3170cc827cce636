#!/usr/bin/env python3
"""PyTorch eager on the GPU: the baseline tools/gpu_check.sh compares Keel's cuda device with (issue 8).

usage: gpu_torch_bench.py [--peers DIR] [--models resnet18,transformer_enc] [--batches 1,64]
                          [--precisions fp32,fp16] [--warmup 10] [--iters 50] [--max-seconds 8]
                          [--cudnn-benchmark] [--json]

For every (model, batch, precision): the seeded module and input of make_models.build_model(name) (the same
weights Keel's ONNX export holds), the input's first dimension repeated to the batch, moved to cuda:0, fp16 by
.half() on module and input (fp32 otherwise), run under torch.inference_mode(). Each timed iteration is bracketed by
torch.cuda.synchronize(); the median of the timed runs (after the warm-up, stopping after --max-seconds) gives the
latency and batch / median the throughput. PyTorch's defaults are kept (cudnn.benchmark off unless
--cudnn-benchmark; TF32 as the installed torch sets it), so this is plain eager mode. --json prints one JSON object
per line: model, batch, precision, median_ms, p90_ms, min_ms, iters, throughput_per_s, device, torch.

usage: gpu_torch_bench.py --train --data DIR [--models simple,lenet] [--precisions fp32,fp16] [--epochs 2]
                          [--batch 64] [--seed 0] [--device cuda] [--json]

Training: `keel train`'s loop in PyTorch eager (the CPU peer shared/peers/train_torch_fmnist.py, on a device):
SimpleCNN or the LeNet-like model, SGD(lr 0.01, momentum 0.9), batch 64, cross-entropy, shuffled every epoch;
the IDX files of DIR (.gz or not) decoded once into host u8 tensors, each batch gathered and normalised
((x / 255 - 0.2860) / 0.3530) on the host and copied to the device, as Keel's loader does; loss.item() every step;
test accuracy over batches of 1000 in eval mode after every epoch. fp16 is torch.autocast(float16) with a dynamic
GradScaler (Keel's --amp fp16). Each epoch is timed from its first batch to a synchronize after its last step.
--json prints one object per (model, precision): mode "train", model, precision, epochs [{epoch, seconds,
img_per_s, train_loss, test_accuracy}], epoch_seconds (the last epoch's: after the first, warm-up excluded),
test_accuracy, peak_memory_bytes / peak_reserved_bytes (torch.cuda.max_memory_allocated / _reserved over the
run, evaluation included; 0 on the CPU), device, torch.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time


def find_peers(explicit):
    here = os.path.dirname(os.path.abspath(__file__))
    for d in ([explicit] if explicit else []) + [here, os.path.join(here, "peers"),
                                                os.path.join(here, "..", "..", "shared", "peers"),
                                                "/work/shared/peers"]:
        if d and os.path.isfile(os.path.join(d, "make_models.py")):
            return os.path.abspath(d)
    sys.exit("gpu_torch_bench: make_models.py not found (pass --peers DIR)")


MEAN, STD = 0.2860, 0.3530  # Keel's FashionMnist normalisation (core/train/data.h)


def load_idx(path):
    import gzip
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(data, prefix):
    import torch
    out = []
    for stem in ("-images-idx3-ubyte", "-labels-idx1-ubyte"):
        path = next((os.path.join(data, prefix + stem + ext) for ext in ("", ".gz")
                     if os.path.isfile(os.path.join(data, prefix + stem + ext))), None)
        if path is None:
            sys.exit(f"gpu_torch_bench: no {prefix}{stem}[.gz] in {data}")
        out.append(load_idx(path))
    return torch.from_numpy(out[0].copy()), torch.from_numpy(out[1].astype("int64"))


def train_models():
    import torch.nn as nn
    import torch.nn.functional as F
    import torch

    class Simple(nn.Module):  # keel train --model simple
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 32, 3)
            self.fc = nn.Linear(32 * 13 * 13, 10)

        def forward(self, x):
            return self.fc(torch.flatten(F.max_pool2d(F.relu(self.conv(x)), 2), 1))

    class LeNet(nn.Module):  # keel train --model lenet
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3)
            self.conv2 = nn.Conv2d(32, 64, 3)
            self.drop1 = nn.Dropout(0.25)
            self.fc1 = nn.Linear(64 * 12 * 12, 128)
            self.drop2 = nn.Dropout(0.5)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = self.drop2(F.relu(self.fc1(torch.flatten(self.drop1(x), 1))))
            return self.fc2(x)

    return {"simple": Simple, "lenet": LeNet}


def train(a):
    import torch
    import torch.nn.functional as F

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("gpu_torch_bench: torch.cuda.is_available() is False")
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    xtr, ytr = load_split(a.data, "train")
    xte, yte = load_split(a.data, "t10k")
    n = xtr.shape[0]
    builders = train_models()
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def to_input(xb_u8):
        return ((xb_u8.float() / 255.0 - MEAN) / STD).unsqueeze(1).to(dev, non_blocking=True)

    for model_name in a.models.split(","):
        if model_name not in builders:
            sys.exit(f"gpu_torch_bench: --train model {model_name}: simple or lenet")
        for prec in a.precisions.split(","):
            if prec not in ("fp32", "fp16"):
                sys.exit(f"gpu_torch_bench: precision {prec}: fp32 or fp16")
            amp = prec == "fp16"
            if amp and not cuda:
                sys.exit("gpu_torch_bench: --train fp16 needs --device cuda")
            torch.manual_seed(a.seed)
            model = builders[model_name]().to(dev)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if amp:
                scaler = (torch.amp.GradScaler("cuda") if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
                          else torch.cuda.amp.GradScaler())
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)

            def autocast():
                return torch.autocast("cuda", dtype=torch.float16) if amp else contextlib.nullcontext()
            epochs = []
            for ep in range(a.epochs):
                model.train()
                sync()
                t0 = time.perf_counter()
                perm = torch.randperm(n)
                loss_sum, batches = 0.0, 0
                for i in range(0, n, a.batch):
                    idx = perm[i:i + a.batch]
                    xb, yb = to_input(xtr[idx]), ytr[idx].to(dev, non_blocking=True)
                    with autocast():
                        loss = F.cross_entropy(model(xb), yb)
                    opt.zero_grad(set_to_none=True)
                    if amp:
                        scaler.scale(loss).backward()
                        scaler.step(opt)
                        scaler.update()
                    else:
                        loss.backward()
                        opt.step()
                    loss_sum += loss.item()
                    batches += 1
                sync()
                dt = time.perf_counter() - t0
                model.eval()
                correct = 0
                # Evaluated at the training batch, as `keel train` does: the peak memory below then compares
                # training with training (at 1,000 a batch the evaluation set PyTorch's peak).
                with torch.no_grad(), autocast():
                    for i in range(0, xte.shape[0], a.batch):
                        out = model(to_input(xte[i:i + a.batch]))
                        correct += (out.argmax(1).cpu() == yte[i:i + a.batch]).sum().item()
                epochs.append({"epoch": ep + 1, "seconds": dt, "img_per_s": n / dt,
                               "train_loss": loss_sum / max(1, batches), "test_accuracy": correct / xte.shape[0]})
            r = {"mode": "train", "model": model_name, "precision": prec, "batch": a.batch, "train_images": n,
                 "epochs": epochs, "epoch_seconds": epochs[-1]["seconds"] if epochs else 0.0,
                 "test_accuracy": epochs[-1]["test_accuracy"] if epochs else 0.0,
                 "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if cuda else 0,
                 "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev) if cuda else 0,
                 "device": name, "torch": torch.__version__}
            if a.json:
                print(json.dumps(r), flush=True)
            else:
                print(f"{model_name:8s} {prec}: last epoch {r['epoch_seconds']:.3f} s, test accuracy "
                      f"{r['test_accuracy']:.4f}, peak {r['peak_memory_bytes'] / 2**20:.1f} MiB", flush=True)
            del model, opt
            if cuda:
                torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="")
    ap.add_argument("--models", default="resnet18,transformer_enc")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=8.0)
    ap.add_argument("--cudnn-benchmark", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--train", action="store_true", help="time keel train's training loop instead of inference")
    ap.add_argument("--data", default="", help="--train: folder of the IDX files")
    ap.add_argument("--epochs", type=int, default=2, help="--train: epochs per (model, precision)")
    ap.add_argument("--batch", type=int, default=64, help="--train: batch size")
    ap.add_argument("--seed", type=int, default=0, help="--train: torch.manual_seed")
    ap.add_argument("--device", default="cuda", help="--train: cuda (or cpu, to check the script without a GPU)")
    a = ap.parse_args()
    if a.train:
        if not a.data:
            sys.exit("gpu_torch_bench: --train needs --data DIR")
        if a.models == "resnet18,transformer_enc":
            a.models = "simple,lenet"
        if a.epochs < 1 or a.batch < 1:
            sys.exit("gpu_torch_bench: --epochs and --batch must be >= 1")
        train(a)
        return

    sys.path.insert(0, find_peers(a.peers))
    import torch
    import make_models

    if not torch.cuda.is_available():
        sys.exit("gpu_torch_bench: torch.cuda.is_available() is False")
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    dev = torch.device("cuda:0")
    name = torch.cuda.get_device_name(0)
    for model in a.models.split(","):
        m, x = make_models.build_model(model)
        for prec in a.precisions.split(","):
            if prec not in ("fp32", "fp16"):
                sys.exit(f"gpu_torch_bench: precision {prec}: fp32 or fp16")
            mm = m.to(dev)
            mm = mm.half() if prec == "fp16" else mm.float()
            for batch in (int(b) for b in a.batches.split(",")):
                reps = [batch // x.shape[0]] + [1] * (x.dim() - 1)
                xb = x.repeat(*reps).to(dev)
                xb = xb.half() if prec == "fp16" else xb.float()
                times = []
                with torch.inference_mode():
                    for _ in range(a.warmup):
                        mm(xb)
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(a.iters):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        mm(xb)
                        torch.cuda.synchronize()
                        times.append((time.perf_counter() - t0) * 1e3)
                        if time.perf_counter() - start > a.max_seconds:
                            break
                med = statistics.median(times)
                srt = sorted(times)
                r = {"model": model, "batch": batch, "precision": prec, "median_ms": med,
                     "p90_ms": srt[min(len(srt) - 1, int(0.9 * (len(srt) - 1) + 0.5))], "min_ms": srt[0],
                     "iters": len(times), "throughput_per_s": batch * 1000.0 / med if med > 0 else 0.0,
                     "device": name, "torch": torch.__version__, "cudnn_benchmark": a.cudnn_benchmark}
                if a.json:
                    print(json.dumps(r), flush=True)
                else:
                    print(f"{model:16s} batch {batch:3d} {prec}: median {med:8.3f} ms, "
                          f"{r['throughput_per_s']:10.1f} samples/s ({len(times)} runs)", flush=True)
            m = mm.float().cpu()
        del m
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
