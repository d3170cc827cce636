#!/usr/bin/python3
"""INT8 side by side: Keel int8 vs Keel fp32 vs ONNX Runtime on the same QDQ file, in one run.

For each model of the peers' folder (default resnet18, mobilenet_v2; ONNX test layout, made by
peers/make_models.py), it:
  1. writes random-normal calibration batches (seed 1) and runs `keel quantize --calib` on them -> model_int8.onnx;
  2. checks accuracy on held-out random-normal inputs (seed 2): cosine of Keel's int8 logits (fuse_qdq -> oneDNN int8
     kernels) and of Keel's QDQ-reference logits (--passes none) against Keel's fp32 logits;
  3. benchmarks, interleaved in fresh processes per round: keel fp32, keel int8, ORT fp32 and ORT on the QDQ file
     (peers/ort_bench.js, which also proves ONNX Runtime loads and runs the QDQ file), and prints median latencies
     and ratios.

usage: tools/compare_int8.py --keel build/bin/keel [--models resnet18,mobilenet_v2] [--threads 1[,2]] [--rounds 3]
                             [--method mse] [--tolerance 0.12 [--fallback prefix]] [--exclude NODE,...]
                             [--int8-winograd true|timed] [--int8-precision bf16]

On a shared, loaded machine the medians swing by 2-3x between runs; the per-engine minimum over all rounds (also
printed) is the steadier comparison there, and so are the paired ratios (within each round, median over rounds).
A cell with fewer threads than the machine has CPUs runs every engine of a round on the same CPUs, the rounds
rotating over them (--no-pin turns this off), as tools/compare_peers.py does: one vCPU of a virtual machine can be
much slower than another, and unpinned, each fresh process lands on either.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
from onnx import numpy_helper


def run(cmd, ok=(0,), cpus=None, env=None, **kw):
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin,
                       env=dict(os.environ, **env) if env else None, **kw)
    if r.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def last_json(out):
    """The last JSON object of a command's output (one line, or pretty-printed from a line starting with '{')."""
    lines = out.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    raise RuntimeError("no JSON in output:\n" + out[-2000:])


def write_pb(path, arr, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(arr, name).SerializeToString())


def read_pb(path):
    from onnx import TensorProto
    t = TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", default="build/bin/keel")
    ap.add_argument("--models-dir", default=os.path.join(os.environ.get("KEEL_PEERS_ROOT", "/tmp/keel-peers"), "models"))
    ap.add_argument("--peers-dir", default="/work/shared/peers")
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", type=int, default=3, help="benchmark rounds (0: the accuracy check alone)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calib", type=int, default=20, help="calibration batches (the last fifth is held out)")
    ap.add_argument("--heldout", type=int, default=4, help="held-out inputs for the cosine check")
    ap.add_argument("--method", default="mse", help="keel quantize --method (mse, minmax, percentile, entropy)")
    ap.add_argument("--tolerance", default="0", help="keel quantize --tolerance (relative L2 error of the outputs)")
    ap.add_argument("--fallback", default="sensitivity", help="keel quantize --fallback (sensitivity | prefix)")
    ap.add_argument("--exclude", default="", help="keel quantize --exclude (node names kept fp32, comma-separated)")
    ap.add_argument("--quantize-arg", action="append", default=[],
                    help="a further argument for keel quantize (repeatable; e.g. --quantize-arg=--no-bias-correction)")
    ap.add_argument("--int8-winograd", default="", metavar="MODE",
                    help="also run Keel int8 with the oneDNN plugin's int8_winograd option (true | timed): its "
                         "held-out cosine and a fifth engine, keel_int8_wino, in the same rounds")
    ap.add_argument("--int8-precision", default="fp32", choices=("fp32", "bf16"),
                    help="keel --precision for the int8 model (its accuracy check and its engine): bf16 runs the layers "
                         "kept in fp32 (a --fallback) in bf16")
    ap.add_argument("--work", default=None)
    ap.add_argument("--no-pin", action="store_true",
                    help="let the scheduler place each engine (default: a round's engines share its CPUs)")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="keel-int8-")
    keel = os.path.abspath(a.keel)
    t0 = a.threads.split(",")[0]  # quantize and the accuracy runs use the first thread count
    summary = []
    for model in a.models.split(","):
        src = os.path.join(a.models_dir, model)
        meta = json.load(open(os.path.join(src, "meta.json")))
        shape, in_name = meta["input_shape"], meta["input_name"]
        d = os.path.join(work, model)
        calib = os.path.join(d, "calib")
        os.makedirs(calib, exist_ok=True)
        rng = np.random.default_rng(1)
        for i in range(a.calib):
            np.save(os.path.join(calib, f"b{i:03d}.npy"), rng.standard_normal(shape).astype(np.float32))
        qdir = os.path.join(d, "int8")
        os.makedirs(qdir, exist_ok=True)
        for f in ("meta.json", "test_data_set_0"):
            if not os.path.exists(os.path.join(qdir, f)):
                os.symlink(os.path.join(src, f), os.path.join(qdir, f))
        qmodel = os.path.join(qdir, "model.onnx")
        out = run([keel, "--threads", t0, "quantize", os.path.join(src, "model.onnx"), "--calib", calib, "-o", qmodel,
                   "--method", a.method, "--tolerance", a.tolerance, "--fallback", a.fallback, "-q"] +
                  (["--exclude", a.exclude] if a.exclude else []) + a.quantize_arg)
        tail = [l for l in out.strip().splitlines() if not l.startswith("note:")]
        print(f"== {model}: keel quantize --method {a.method} --tolerance {a.tolerance} --fallback {a.fallback}\n" +
              "\n".join(tail[-3:]), flush=True)
        # Accuracy on held-out inputs.
        rng = np.random.default_rng(2)
        cos_int8, cos_qdq, cos_wino = [], [], []
        wino_env = {"KEEL_ONEDNN_INT8_WINOGRAD": a.int8_winograd} if a.int8_winograd else None
        for i in range(a.heldout):
            x = rng.standard_normal(shape).astype(np.float32)
            xin = os.path.join(d, f"held_{i}.pb")
            write_pb(xin, x, in_name)
            outs = {}
            for tag, m, passes in (("fp32", os.path.join(src, "model.onnx"), "none"), ("int8", qmodel, "auto"),
                                   ("qdq", qmodel, "none")):
                od = os.path.join(d, f"out_{tag}_{i}")
                prec = ["--precision", a.int8_precision] if tag == "int8" else []
                run([keel, "--threads", t0, "run", m, "--input", f"{in_name}={xin}", "--passes", passes,
                     "--output-dir", od] + prec)
                outs[tag] = read_pb(os.path.join(od, "output_0.pb"))
            cos_int8.append(cosine(outs["fp32"], outs["int8"]))
            cos_qdq.append(cosine(outs["fp32"], outs["qdq"]))
            if wino_env:
                od = os.path.join(d, f"out_wino_{i}")
                run([keel, "--threads", t0, "run", qmodel, "--input", f"{in_name}={xin}", "--output-dir", od,
                     "--precision", a.int8_precision], env=wino_env)
                cos_wino.append(cosine(outs["fp32"], read_pb(os.path.join(od, "output_0.pb"))))
        print(f"   held-out cosine vs fp32 (min of {a.heldout}): keel int8"
              f"{' (--precision ' + a.int8_precision + ')' if a.int8_precision != 'fp32' else ''} {min(cos_int8):.5f}, "
              f"QDQ reference {min(cos_qdq):.5f}" +
              (f", keel int8 with int8_winograd={a.int8_winograd} {min(cos_wino):.5f}" if wino_env else ""),
              flush=True)
        # Latency, interleaved.
        engines = {
            "keel_fp32": lambda t: [keel, "--threads", t, "bench", os.path.join(src, "model.onnx"), "--passes", "none"],
            "keel_int8": lambda t: [keel, "--threads", t, "bench", qmodel, "--precision", a.int8_precision],
            "ort_fp32": lambda t: ["node", os.path.join(a.peers_dir, "ort_bench.js"), src, "--threads", t],
            "ort_int8": lambda t: ["node", os.path.join(a.peers_dir, "ort_bench.js"), qdir, "--threads", t],
        }
        if wino_env:
            engines["keel_int8_wino"] = lambda t: [keel, "--threads", t, "bench", qmodel, "--precision",
                                                   a.int8_precision]
        if a.rounds <= 0:  # accuracy only
            summary.append({"model": model, "cos_int8": min(cos_int8), "cos_qdq": min(cos_qdq)})
            continue
        allowed = sorted(os.sched_getaffinity(0))
        for t in a.threads.split(","):
            med = {e: [] for e in engines}
            mins = {e: [] for e in engines}
            paired = {"int8/fp32": [], "ort_int8/int8": [], "wino/fp32": []}
            ort_q = None
            for r in range(a.rounds):
                order = list(engines)[r % len(engines):] + list(engines)[:r % len(engines)]
                cpus = None
                if not a.no_pin and int(t) < len(allowed):
                    cpus = {allowed[(r * int(t) + k) % len(allowed)] for k in range(int(t))}
                for e in order:
                    cmd = engines[e](t) + ["--iters", str(a.iters), "--warmup", "3", "--max-seconds", "20", "--json"]
                    # ort_bench.js exits 2 when the output is off PyTorch's fp32 output by more than its fp32
                    # tolerance, which an int8 model is by design: its JSON (max_abs_diff) is still reported.
                    j = last_json(run(cmd, ok=(0, 2) if e == "ort_int8" else (0,), cpus=cpus,
                                      env=wino_env if e == "keel_int8_wino" else None))
                    med[e].append(float(j["median_ms"]))
                    mins[e].append(float(j.get("min_ms", j["median_ms"])))
                    if e == "ort_int8":
                        ort_q = j
                paired["int8/fp32"].append(med["keel_fp32"][-1] / med["keel_int8"][-1])
                paired["ort_int8/int8"].append(med["ort_int8"][-1] / med["keel_int8"][-1])
                if wino_env:
                    paired["wino/fp32"].append(med["keel_fp32"][-1] / med["keel_int8_wino"][-1])
            m = {e: statistics.median(v) for e, v in med.items()}
            print(f"   threads {t}: median ms  " + "  ".join(f"{e} {m[e]:.2f}" for e in engines), flush=True)
            print(f"   keel int8 speed-up vs keel fp32: {m['keel_fp32'] / m['keel_int8']:.2f}x; "
                  f"vs ORT on the QDQ file: {m['ort_int8'] / m['keel_int8']:.2f}x; "
                  f"ORT int8 vs ORT fp32: {m['ort_fp32'] / m['ort_int8']:.2f}x", flush=True)
            mn = {e: min(v) for e, v in mins.items()}
            print(f"   threads {t}: min ms     " + "  ".join(f"{e} {mn[e]:.2f}" for e in engines) +
                  f"  (int8 vs fp32 {mn['keel_fp32'] / mn['keel_int8']:.2f}x, vs ORT {mn['ort_int8'] / mn['keel_int8']:.2f}x)",
                  flush=True)
            print(f"   threads {t}: paired (within a round, median of {a.rounds}): keel int8 vs keel fp32 "
                  f"{statistics.median(paired['int8/fp32']):.2f}x, vs ORT on the QDQ file "
                  f"{statistics.median(paired['ort_int8/int8']):.2f}x"
                  + (f", with int8_winograd={a.int8_winograd} {statistics.median(paired['wino/fp32']):.2f}x Keel fp32"
                     if wino_env else "")
                  + (" (pinned)" if int(t) < len(allowed) and not a.no_pin else ""),
                  flush=True)
            if ort_q:
                print(f"   ORT ran the QDQ file: max_abs_diff vs PyTorch fp32 {ort_q.get('max_abs_diff')}, "
                      f"rel {ort_q.get('rel_diff')}", flush=True)
            summary.append({"model": model, "threads": t, "median_ms": m, "min_ms": mn, "cos_int8": min(cos_int8),
                            "cos_qdq": min(cos_qdq)} | ({"cos_int8_wino": min(cos_wino)} if wino_env else {}))
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
