#!/usr/bin/env python3
"""Fuzzes Keel's handling of shape computations (what unfolded exports carry: Shape -> Gather/Concat/Add/... -> Reshape).

Each case is a small random ONNX model: Shape ops (with random start/end) of an input of random rank, a few random
ops over the resulting int64 vectors and small constants of 0-3 elements (Add, Sub, Mul, Div, Mod, Gather, Slice,
Concat, Squeeze, Unsqueeze, Size, Cast, Range, ConstantOfShape, Expand, Where, Equal, Max, Neg, Tile, ReduceProd,
Constant), and a Reshape of the input to one of them. Most cases are invalid on purpose. Every case goes through
`keel run` with the given pass settings (loading, ONNX shape inference with data propagation, session shape values,
passes, kernels); a case passes when the process exits with a status (0 or an error), and fails on a signal or a
hang. Failing models are kept, with a one-line repro each.

    python3 tests/fuzz/fuzz_shape_computations.py --keel build/bin/keel --cases 500 --seed 1 --keep /tmp/fuzz-shapes

Needs python3-onnx and python3-numpy (Debian packages); not part of the test suite (it takes minutes).
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_case(rng):
    nodes, inits = [], []
    counter = [0]

    def name():
        counter[0] += 1
        return f"v{counter[0]}"

    def const(scalar_ok=True):
        c = name()
        if scalar_ok and rng.random() < 0.2:
            v = np.array(rng.randint(-4, 5), dtype=np.int64)
        else:
            v = np.array([rng.randint(-4, 5) for _ in range(rng.choice([0, 1, 1, 2, 3]))], dtype=np.int64)
        inits.append(numpy_helper.from_array(v, c))
        return c

    x_shape = [rng.randint(1, 4) for _ in range(rng.randint(0, 4))]
    pool = []
    for _ in range(rng.randint(1, 2)):
        attrs = {}
        if rng.random() < 0.5:
            attrs["start"] = rng.randint(-5, 5)
        if rng.random() < 0.3:
            attrs["end"] = rng.randint(-5, 5)
        s = name()
        nodes.append(helper.make_node("Shape", ["x"], [s], **attrs))
        pool.append(s)
    for _ in range(rng.randint(1, 7)):
        a, o = rng.choice(pool), name()
        b = rng.choice(pool + [const()])
        op = rng.choice(["Add", "Sub", "Mul", "Div", "Mod", "Gather", "Slice", "Concat", "Squeeze", "Unsqueeze",
                         "Size", "Cast", "Shape", "Range", "ConstantOfShape", "Expand", "Where", "Equal", "Max",
                         "Neg", "Tile", "ReduceProd", "Constant"])
        if op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Equal"):
            n = helper.make_node(op, [a, b], [o])
        elif op == "Gather":
            n = helper.make_node(op, [a, b], [o], axis=rng.choice([0, 0, -1, 1]))
        elif op == "Slice":
            extra = [const(False) for _ in range(rng.randint(0, 2))]
            n = helper.make_node(op, [a, const(False), const(False)] + extra, [o])
        elif op == "Concat":
            n = helper.make_node(op, [a, b], [o], axis=rng.choice([0, -1, 1]))
        elif op in ("Squeeze", "Unsqueeze"):
            n = helper.make_node(op, [a] + ([const(False)] if rng.random() < 0.8 else []), [o])
        elif op == "Cast":
            n = helper.make_node(op, [a], [o], to=rng.choice([TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT]))
        elif op == "Range":
            n = helper.make_node(op, [a, b, const()], [o])
        elif op == "Expand":
            n = helper.make_node(op, [b, a], [o])
        elif op == "Where":
            n = helper.make_node(op, [b, a, b], [o])
        elif op == "Tile":
            n = helper.make_node(op, [a, b], [o])
        elif op == "ReduceProd":
            n = helper.make_node(op, [a], [o], keepdims=rng.randint(0, 1))
        elif op == "Constant":
            v = np.array([rng.randint(-2, 2**40) for _ in range(rng.randint(0, 3))], dtype=np.int64)
            n = helper.make_node(op, [], [o], value=numpy_helper.from_array(v))
        else:  # Shape, Size, ConstantOfShape, Neg
            n = helper.make_node(op, [a], [o])
        nodes.append(n)
        pool.append(o)
    nodes.append(helper.make_node("Reshape", ["x", rng.choice(pool)], ["reshaped"]))
    nodes.append(helper.make_node("ReduceSum", ["reshaped"], ["y"], keepdims=0))
    graph = helper.make_graph(nodes, "shape_fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", rng.choice([13, 14, 15]))])
    model.ir_version = 8
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keel", default="build/bin/keel", help="the keel binary")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--passes", default="none,auto", help="comma list of --passes values to run each case with")
    ap.add_argument("--keep", default=None, help="folder for failing models (default: a new temporary folder)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take before it counts as a hang")
    args = ap.parse_args()
    keep = args.keep or tempfile.mkdtemp(prefix="keel-shape-fuzz-")
    os.makedirs(keep, exist_ok=True)
    rng = random.Random(args.seed)
    failures = loaded = 0
    for i in range(args.cases):
        model = make_case(rng)
        path = os.path.join(keep, f"case_{args.seed}_{i}.onnx")
        onnx.save(model, path)
        failed = False
        for passes in args.passes.split(","):
            cmd = [args.keel, "run", path, "--passes", passes, "--print", "0", "--threads", "1"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                verdict = f"signal {-r.returncode}" if r.returncode < 0 else None
                loaded += r.returncode == 0
            except subprocess.TimeoutExpired:
                verdict = f"no exit after {args.timeout:.0f} s"
            if verdict:
                failed = True
                print(f"FAIL ({verdict}): {' '.join(cmd)}", flush=True)
        failures += failed
        if not failed:
            os.remove(path)
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{args.cases} cases, {failures} failing", file=sys.stderr, flush=True)
    print(f"{args.cases} cases ({loaded} runs ran to the end), {failures} failing; failing models kept in {keep}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
