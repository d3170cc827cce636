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
"""
import argparse
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
    a = ap.parse_args()

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
