#!/usr/bin/env python3
"""Fuzzes INT8 post-training quantization (`keel quantize`) with the random chains' float models.

Each case is a random chain (`keel-cts --random-chains 1 --seed S --save DIR`: 2-6 blocks of CNN or transformer-like
ops, static or dynamic batch) written as an ONNX model. The fuzzer draws calibration batches for it (normal values of
the inputs' shapes), quantizes it with a random set of options (calibration method, u8 or s8 activations, per-tensor
or per-channel weights, bias correction, GPTQ rounding, a tolerance with either fallback) and runs the QDQ model it
wrote on held-out inputs with `keel run`, next to the float model. A case passes when quantize either writes a model
or refuses the input with an error (exit status 1 and a message), and the QDQ model then runs and gives outputs of the
float model's shapes whose relative L2 error stays under --max-error (0.5 by default: about 3x the worst of every
method on seeds 1-340, 0.17, so a calibration that loses most of a signal fails, as the entropy method's clipping of
activations away from zero did at 0.6-0.68, as well as NaNs, infinities, garbage and sign flips); it fails on a signal, a hang, an error
from `keel run` on the model quantize wrote, a sanitizer's report (ASan, UBSan, TSan builds: --build build-asan), a
shape change or an error over the bound. Failing cases are kept with
their repro (the keel-cts, quantize and run commands).

    /usr/bin/python3 tests/fuzz/fuzz_quantize.py --build build --cases 200 --seed 1 --keep /tmp/fuzz-quantize

Needs python3-onnx and python3-numpy (Debian packages). The test suite runs a short, fixed-seed run (ctest -R
fuzz_quantize).
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper


SANITIZER_REPORTS = ("AddressSanitizer", "LeakSanitizer", "ThreadSanitizer", "runtime error:")


def run(cmd, timeout, env=None):
    """(exit status, output); a sanitizer's report counts as a signal (-1) whatever the status it exits with."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        out = p.stdout + p.stderr
        return (-1 if any(r in out for r in SANITIZER_REPORTS) else p.returncode), out
    except subprocess.TimeoutExpired:
        return "timeout", ""


def load_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def save_pb(array, name, path):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(array, name).SerializeToString())


def inputs_of(model_path, case_dir):
    """The model's non-initializer inputs, with the shapes of the case's own inputs (dynamic dims resolved)."""
    m = onnx.load(model_path)
    inits = {i.name for i in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    out = []
    for k, n in enumerate(names):
        a = load_pb(os.path.join(case_dir, "test_data_set_0", f"input_{k}.pb"))
        out.append((n, a.shape, a.dtype))
    return out


def draw_input(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):  # token ids: small non-negative values, as the chain's embedding takes
        return rng.integers(0, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def quantize_options(r):
    opts = ["--method", r.choice(["mse", "minmax", "percentile", "entropy"]),
            "--activations", r.choice(["u8", "u8", "s8"])]
    if r.random() < 0.25:
        opts.append("--per-tensor")
    if r.random() < 0.25:
        opts.append("--no-bias-correction")
    if r.random() < 0.25:
        opts += ["--weight-rounding", "gptq"]
    if r.random() < 0.35:
        opts += ["--tolerance", r.choice(["0.02", "0.1"]), "--fallback", r.choice(["sensitivity", "prefix"])]
    return opts


def one_case(args, seed, work):
    r = random.Random(seed)
    case = os.path.join(work, "case")
    shutil.rmtree(case, ignore_errors=True)
    cts = [os.path.join(args.build, "bin", "keel-cts"), "--random-chains", "1", "--seed", str(seed), "--save", case]
    rc, out = run(cts, 60)
    if rc != 0:
        return "skip", f"keel-cts --save: {out.strip()[:200]}", []
    model = os.path.join(case, "model.onnx")
    ins = inputs_of(model, case)
    rng = np.random.default_rng(seed)
    calib = os.path.join(work, "calib")
    shutil.rmtree(calib, ignore_errors=True)
    for b in range(r.choice([10, 16, 20])):
        d = os.path.join(calib, f"b{b}")
        os.makedirs(d)
        for k, (name, shape, dtype) in enumerate(ins):
            save_pb(draw_input(rng, shape, dtype), name, os.path.join(d, f"input_{k}.pb"))
    held = os.path.join(work, "held")
    shutil.rmtree(held, ignore_errors=True)
    os.makedirs(held)
    feeds = []
    for k, (name, shape, dtype) in enumerate(ins):
        p = os.path.join(held, f"input_{k}.pb")
        save_pb(draw_input(rng, shape, dtype), name, p)
        feeds += ["-i", f"{name}={p}"]
    qdq = os.path.join(work, "model.int8.onnx")
    keel = os.path.join(args.build, "bin", "keel")
    quant = [keel, "quantize", model, "-c", calib, "-o", qdq, "-q"] + quantize_options(r)
    repro = [" ".join(cts), " ".join(quant)]
    rc, out = run(quant, args.timeout)
    if rc == "timeout" or (isinstance(rc, int) and rc < 0):
        what = "hang" if rc == "timeout" else "a sanitizer report" if rc == -1 else f"signal {-rc}"
        return "fail", f"keel quantize: {what}\n{out[-2000:]}", repro
    if rc != 0:
        if rc == 1 and out.strip():
            return "refused", out.strip().splitlines()[-1][:300], repro
        return "fail", f"keel quantize exited {rc} without a message\n{out[-2000:]}", repro
    outs = {}
    for tag, path in (("float", model), ("int8", qdq)):
        d = os.path.join(work, f"out_{tag}")
        shutil.rmtree(d, ignore_errors=True)
        cmd = [keel, "run", path, "-o", d, "--print", "0"] + feeds
        repro.append(" ".join(cmd))
        rc, out = run(cmd, args.timeout)
        if rc != 0:
            return "fail", f"keel run of the {tag} model: {rc}\n{out[-2000:]}", repro
        k, got = 0, []
        while os.path.exists(os.path.join(d, f"output_{k}.pb")):
            got.append(load_pb(os.path.join(d, f"output_{k}.pb")))
            k += 1
        outs[tag] = got
    if len(outs["float"]) != len(outs["int8"]):
        return "fail", f"{len(outs['float'])} float outputs, {len(outs['int8'])} int8 ones", repro
    worst = 0.0
    for a, b in zip(outs["float"], outs["int8"]):
        if a.shape != b.shape:
            return "fail", f"output shape {b.shape} instead of {a.shape}", repro
        if not np.issubdtype(a.dtype, np.floating):
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if not np.all(np.isfinite(b64)) and np.all(np.isfinite(a64)):
            return "fail", "non-finite outputs from the int8 model", repro
        err = np.linalg.norm(b64 - a64) / max(np.linalg.norm(a64), 1e-6)
        worst = max(worst, err)
    if worst > args.max_error:
        return "fail", f"relative L2 error {worst:.3g} > {args.max_error}", repro
    return "pass", f"relative L2 error {worst:.3g}", repro


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="Keel's build directory (bin/keel, bin/keel-cts)")
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1, help="The first random chain's seed")
    ap.add_argument("--timeout", type=float, default=120, help="Seconds per quantize / run process")
    ap.add_argument("--max-error", type=float, default=0.5, help="Largest relative L2 error of the int8 outputs")
    ap.add_argument("--keep", default="", help="Directory for failing cases (model, calibration, repro)")
    ap.add_argument("--verbose", "-v", action="store_true", help="Print every case's error and quantize options")
    args = ap.parse_args()
    counts = {"pass": 0, "refused": 0, "skip": 0, "fail": 0}
    errors = []
    with tempfile.TemporaryDirectory(prefix="keel-fuzz-quantize-") as work:
        for seed in range(args.seed, args.seed + args.cases):
            status, msg, repro = one_case(args, seed, work)
            counts[status] += 1
            if status == "fail":
                print(f"FAIL seed {seed}: {msg}", flush=True)
                for line in repro:
                    print(f"    {line}", flush=True)
                if args.keep:
                    dst = os.path.join(args.keep, f"seed{seed}")
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(work, dst)
                    with open(os.path.join(dst, "repro.txt"), "w") as f:
                        f.write("\n".join(repro) + "\n")
            elif status == "pass":
                errors.append(float(msg.split()[-1]))
                if args.verbose:
                    print(f"pass seed {seed}: {msg}: {repro[1].split(' -q ')[-1]}", flush=True)
            elif status == "refused":
                print(f"refused seed {seed}: {msg}", flush=True)
    summary = ", ".join(f"{v} {k}" for k, v in counts.items())
    if errors:
        summary += f"; relative L2 error median {np.median(errors):.3g}, worst {max(errors):.3g}"
    print(f"fuzz_quantize: {args.cases} cases from seed {args.seed}: {summary}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
