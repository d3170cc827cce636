#!/usr/bin/python3
"""End-to-end check of `keel prune --mode channel` on small generated models, with ONNX Runtime where it is installed.

Each model is built with onnx.helper so that the channels the pruner removes are exactly the zero ones (zero weight
rows and biases after a Relu), so the pruned model must give the original's outputs. For every model and ratio:
  1. `keel run` the original (its outputs are the reference),
  2. `keel prune MODEL --ratio R --mode channel -o pruned.onnx`, checking the parameters removed against the count the
     model was built for, and that every skipped group the model was built for is reported with its reason,
  3. `keel run` the pruned file: same output shapes, outputs equal to the reference,
  4. ONNX Runtime (peers/ort_bench.js with the node binding in /tmp/keel-peers/ort, when present): loads and runs the
     pruned file, its output equal to the reference (ort_bench.js compares output 0).
Models: a ResNeXt-style block (grouped 3x3 Conv, 4 groups), a depthwise-multiplier Conv (one input channel per group:
its input group is reported as unprunable), nested Concats (offsets add up), a Concat coupled into a residual Add
(its Convs on both sides of the Add lose the same channels), each also at ratio 0 (nothing changes).

usage: /usr/bin/python3 tools/check_prune.py [--keel build/bin/keel] [--peers-dir ../shared/peers] [--keep DIR]
Exit status 0 when every check passes; ORT is skipped (with a line saying so) where node or the binding is missing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Model:
    def __init__(self, name, x_shape):
        self.name = name
        self.x_shape = x_shape
        self.nodes, self.inits, self.outputs = [], [], []
        self.rng = np.random.default_rng(abs(hash(name)) % (1 << 32))

    def const(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name))
        return name

    def op(self, op, ins, out, **attrs):
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def conv(self, x, out, o, i, k=1, group=1, zero=(), bias=True):
        """Conv with weight [o, i/group, k, k]; rows in `zero` (and their bias) are zero."""
        w = self.rng.normal(0, 0.3, (o, i // group, k, k)).astype(np.float32)
        b = self.rng.normal(0, 0.1, (o,)).astype(np.float32)
        for r in zero:
            w[r] = 0
            b[r] = 0
        ins = [x, self.const(out + "_w", w)] + ([self.const(out + "_b", b)] if bias else [])
        return self.op("Conv", ins, out, group=group, pads=[k // 2] * 4)

    def relu(self, x):
        return self.op("Relu", [x], x + "_relu")

    def save(self, path):
        g = helper.make_graph(self.nodes, self.name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.x_shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["n", "c", "h", "w"]) for o in self.outputs],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="check_prune")
        onnx.checker.check_model(m)
        onnx.save(m, path)

    def params(self):
        return sum(int(np.prod(t.dims)) for t in self.inits)


def resnext():
    # Conv a(8) -> Relu -> Conv g(8, 3x3, group 4) -> Relu -> Conv y(4). One zero channel per block of 2 in a and g.
    m = Model("resnext_block", [1, 4, 8, 8])
    h = m.relu(m.conv("x", "a", 8, 4, zero=(1, 2, 5, 6)))
    h = m.relu(m.conv(h, "g", 8, 8, k=3, group=4, zero=(0, 3, 4, 7)))
    m.outputs = [m.conv(h, "y", 4, 8, bias=False)]
    removed = (4 * 4 + 4) + (8 * 2 * 9 - 4 * 9 + 4) + 4 * 4
    return m, removed, []


def dw_multiplier():
    # Conv a(4) -> Relu -> Conv m(8, 3x3, group 4: 2 outputs per input channel) -> Relu -> Conv y(2).
    m = Model("dw_multiplier", [1, 3, 8, 8])
    h = m.relu(m.conv("x", "a", 4, 3, bias=False))
    h = m.relu(m.conv(h, "m", 8, 4, k=3, group=4, zero=(1, 2, 4, 7)))
    m.outputs = [m.conv(h, "y", 2, 8, bias=False)]
    return m, 4 * 9 + 4 + 2 * 4, [r"skipped: ratio 0\.5 removes no channel of 4 blocks of 1 .*\(a\)"]


def nested_concat():
    # Convs a(4), b(4), c(6) -> Relu; cat2 = Concat(c, Concat(a, b)) -> Relu -> Conv y(3).
    m = Model("nested_concat", [1, 3, 8, 8])
    a = m.relu(m.conv("x", "a", 4, 3, zero=(0, 3)))
    b = m.relu(m.conv("x", "b", 4, 3, zero=(1, 2)))
    c = m.relu(m.conv("x", "c", 6, 3, zero=(0, 2, 4)))
    cat1 = m.op("Concat", [a, b], "cat1", axis=1)
    cat2 = m.op("Concat", [c, cat1], "cat2", axis=1)
    m.outputs = [m.conv(m.relu(cat2), "y", 3, 14, bias=False)]
    return m, 7 * 4 + 3 * 7, []


def concat_add():
    # Conv s(5) -> Relu -> Convs a(4), b(4), r(8); Add(Concat(a, b), Relu(r)) -> Relu -> Conv y(3): a's and b's groups
    # take r's rows at their offsets (0 and 4) along; r's own group is left to them (a note says so).
    m = Model("concat_add", [1, 3, 8, 8])
    h = m.relu(m.conv("x", "s", 5, 3, zero=(0, 3)))
    cat = m.op("Concat", [m.conv(h, "a", 4, 5, zero=(1, 2), bias=False), m.conv(h, "b", 4, 5, zero=(0, 3), bias=False)],
               "cat", axis=1)
    r = m.relu(m.conv(h, "r", 8, 5, zero=(1, 2, 4, 7), bias=False))
    s = m.relu(m.op("Add", [cat, r], "sum"))
    m.outputs = [m.conv(s, "y", 3, 8, bias=False)]
    return m, (6 + 2) + 2 * (8 + 6) + (16 + 12) + 12, [
        r"pruned 2 of 4 channels of residual-coupled group \{a\} .*with 1 Conv\(s\) adding to the Concat's channels",
        r"pruned 2 of 4 channels of residual-coupled group \{b\}",
        r"skipped: cat is the output of Concat cat \(these channels belong to the groups of the Concat's inputs .*\(r\)"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def keel_outputs(keel, model, x_pb, out_dir, n):
    os.makedirs(out_dir, exist_ok=True)
    run([keel, "run", model, "-i", f"x={x_pb}", "-o", out_dir, "--print", "0"])
    return [numpy_helper.to_array(onnx.load_tensor(os.path.join(out_dir, f"output_{k}.pb"))) for k in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default=os.path.join(ROOT, "build", "bin", "keel"))
    ap.add_argument("--peers-dir", default=os.environ.get("KEEL_PEERS_DIR",
                                                          os.path.join(os.path.dirname(ROOT), "shared", "peers")))
    ap.add_argument("--ort-dir", default=os.environ.get("ORT_NODE_DIR", "/tmp/keel-peers/ort"))
    ap.add_argument("--keep", help="write the models here instead of a temporary directory")
    a = ap.parse_args()
    ort_js = os.path.join(a.peers_dir, "ort_bench.js")
    have_ort = (shutil.which("node") and os.path.isfile(ort_js) and
                os.path.isdir(os.path.join(a.ort_dir, "node_modules", "onnxruntime-node")))
    if not have_ort:
        print(f"ONNX Runtime checks skipped (need node, {ort_js} and {a.ort_dir}/node_modules/onnxruntime-node)")
    work = a.keep or tempfile.mkdtemp(prefix="check_prune_")
    failures = 0
    for build in (resnext, dw_multiplier, nested_concat, concat_add):
        for ratio in (0.5, 0.0):
            m, removed, notes = build()
            if ratio == 0.0:
                removed, notes = 0, []
            d = os.path.join(work, f"{m.name}_{ratio}")
            os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
            src = os.path.join(d, "original.onnx")
            m.save(src)
            x = m.rng.normal(0, 1, m.x_shape).astype(np.float32)
            x_pb = os.path.join(d, "test_data_set_0", "input_0.pb")
            with open(x_pb, "wb") as f:
                f.write(numpy_helper.from_array(x, "x").SerializeToString())
            ref = keel_outputs(a.keel, src, x_pb, os.path.join(d, "ref"), len(m.outputs))
            shutil.copy(os.path.join(d, "ref", "output_0.pb"), os.path.join(d, "test_data_set_0", "output_0.pb"))
            dst = os.path.join(d, "model.onnx")
            report = run([a.keel, "prune", src, "--ratio", str(ratio), "--mode", "channel", "-o", dst])
            problems = []
            got = int(re.search(r"params_removed: (\d+)", report).group(1))
            pruned_params = sum(int(np.prod(t.dims)) for t in onnx.load(dst).graph.initializer)
            if got != removed or m.params() - pruned_params != removed:
                problems.append(f"params removed: report {got}, file {m.params() - pruned_params}, expected {removed}")
            for pat in notes:
                if not re.search(pat, report):
                    problems.append(f"no note matching {pat!r}")
            onnx.checker.check_model(onnx.load(dst))
            out = keel_outputs(a.keel, dst, x_pb, os.path.join(d, "pruned"), len(m.outputs))
            for k, (r, o) in enumerate(zip(ref, out)):
                if r.shape != o.shape:
                    problems.append(f"output {k} shape {o.shape} != {r.shape}")
                elif not np.allclose(r, o, atol=1e-5, rtol=1e-5):
                    problems.append(f"output {k} differs by {np.abs(r - o).max():.3g}")
            line = f"{m.name} ratio {ratio}: params {m.params()} -> {pruned_params} (-{got}); keel outputs " + \
                   ("equal" if not any("output" in p for p in problems) else "DIFFER")
            if have_ort:
                p = subprocess.run(["node", ort_js, d, "--iters", "3", "--warmup", "1", "--max-seconds", "2"],
                                   capture_output=True, text=True, env=dict(os.environ, ORT_NODE_DIR=a.ort_dir))
                mad = re.search(r"max_abs_diff=(\S+)", p.stdout)
                if p.returncode != 0:
                    problems.append(f"ONNX Runtime: exit {p.returncode}: {p.stderr.strip()[-300:]}")
                line += f"; ORT runs it, max |ORT - keel original| {mad.group(1) if mad else '?'}"
            print(line + ("" if not problems else "\n  FAIL: " + "\n  FAIL: ".join(problems)), flush=True)
            failures += bool(problems)
    print(f"{'all checks passed' if not failures else f'{failures} model(s) failed'} ({work})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
