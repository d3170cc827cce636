#!/usr/bin/python3
"""Mixed precision measured: `keel bench --precision P` against fp32, interleaved, and the outputs' error.

For each model of the peers' set (/tmp/keel-peers/models/<name>/model.onnx + test_data_set_0, made by
../shared/peers/make_models.py), each round runs `keel bench --json` once per precision, in turn, so that the
machine's load hits them alike; the ratio fp32/P is taken per round and the median of the rounds is printed (and
the ratio of the medians). The error: `keel run --precision P` on test_data_set_0's input against `keel run` in fp32
(cosine similarity and max |err| / max |ref| of each output).

  passes/precision/compare_precision.py [--keel build/bin/keel] [--models resnet18,transformer_enc]
      [--precisions bf16] [--error-precisions bf16,fp16] [--threads 2] [--rounds 5] [--iters 20] [--passes auto]

Needs numpy and onnx (Debian: python3-numpy, python3-onnx) for the error part.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def bench(keel, model, precision, threads, warmup, iters, passes):
    cmd = [keel, "bench", model, "--json", "--threads", str(threads), "--warmup", str(warmup), "--iters", str(iters),
           "--precision", precision, "--passes", passes]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def run_outputs(keel, model_dir, precision, threads, passes):
    import onnx
    from onnx import numpy_helper
    m = onnx.load(os.path.join(model_dir, "model.onnx"), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    data = os.path.join(model_dir, "test_data_set_0")
    args = []
    for k, n in enumerate(names):
        args += ["-i", f"{n}={os.path.join(data, f'input_{k}.pb')}"]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([keel, "run", os.path.join(model_dir, "model.onnx"), *args, "--precision", precision,
                        "--threads", str(threads), "--passes", passes, "-o", d, "--print", "0"],
                       check=True, capture_output=True, text=True)
        outs = []
        k = 0
        while os.path.exists(os.path.join(d, f"output_{k}.pb")):
            t = onnx.TensorProto()
            with open(os.path.join(d, f"output_{k}.pb"), "rb") as f:
                t.ParseFromString(f.read())
            outs.append(numpy_helper.to_array(t).astype("float64").ravel())
            k += 1
        return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default="build/bin/keel")
    ap.add_argument("--models-dir", default="/tmp/keel-peers/models")
    ap.add_argument("--models", default="resnet18,resnet18_b8,transformer_enc,mobilenet_v2")
    ap.add_argument("--precisions", default="bf16", help="timed against fp32")
    ap.add_argument("--error-precisions", default="bf16,fp16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--passes", default="auto", help="session passes before the precision pass")
    ap.add_argument("--no-error", action="store_true")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    precs = ["fp32"] + [p for p in a.precisions.split(",") if p and p != "fp32"]
    med = {(m, p): [] for m in models for p in precs}
    best = {(m, p): [] for m in models for p in precs}
    for r in range(a.rounds):
        for m in models:
            for p in precs:
                j = bench(a.keel, os.path.join(a.models_dir, m, "model.onnx"), p, a.threads, a.warmup, a.iters,
                          a.passes)
                med[(m, p)].append(j["median_ms"])
                best[(m, p)].append(j["min_ms"])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    # On a loaded machine the median is mostly the load; the best run of all rounds is the least disturbed one.
    print(f"| model | " + " | ".join(f"{p} median / best (ms)" for p in precs) + " | " +
          " | ".join(f"fp32/{p}: median of per-round ratios | ratio of best runs" for p in precs[1:]) + " |")
    print("| --- " * (1 + len(precs) + 2 * (len(precs) - 1)) + "|")
    for m in models:
        cells = [f"{statistics.median(med[(m, p)]):.1f} / {min(best[(m, p)]):.1f}" for p in precs]
        for p in precs[1:]:
            ratios = [f / x for f, x in zip(med[(m, "fp32")], med[(m, p)])]
            cells.append(f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")
            cells.append(f"{min(best[(m, 'fp32')]) / min(best[(m, p)]):.2f}x")
        print(f"| {m} | " + " | ".join(cells) + " |")
    if a.no_error:
        return
    import numpy as np
    eprecs = [p for p in a.error_precisions.split(",") if p]
    print()
    print("| model | precision | output | cosine vs fp32 | max abs err / max abs ref |")
    print("| --- | --- | --- | --- | --- |")
    for m in models:
        d = os.path.join(a.models_dir, m)
        ref = run_outputs(a.keel, d, "fp32", a.threads, a.passes)
        for p in eprecs:
            got = run_outputs(a.keel, d, p, a.threads, a.passes)
            for k, (x, y) in enumerate(zip(got, ref)):
                cos = float(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)))
                rel = float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
                print(f"| {m} | {p} | {k} | {cos:.6f} | {rel:.2e} |")


if __name__ == "__main__":
    main()
