#!/usr/bin/python3
"""Keel and ONNX Runtime layer by layer: each engine's own per-node timings on one model, matched node by node.

Keel: `KEEL_ONEDNN_PROFILE=1 keel --log-level info bench MODEL` (the oneDNN chain's steps table: each step's fastest
run). ONNX Runtime: onnxruntime-node of ../shared/peers/setup.sh with `enableProfiling` (its `*_kernel_time` events,
each node's fastest run). Both run pinned to the same CPUs, one after the other, with the same iteration count.

Matching: Keel names a step after the first ONNX node it computes (a Conv with its fused Relu/Add, say); ONNX Runtime
names a fused node after the value it writes (`/layer1/layer1.0/relu/Relu_output_0_nchwc`) or after the node it grew
from (`.../MatMul/MatMulAddFusion`); nodes ORT inserts (reorders, reshapes, a Gelu it split off) match nothing. Each ORT node is traced
back through the original graph from that value over the single-data-input ops a runtime fuses into a producer
(activations, Add of a residual, BatchNormalization) to the first Conv/Gemm/MatMul/pooling node, and matched with
Keel's step of that name; Keel's steps of one node (a reorder before a convolution) are summed. What matches on
neither side is listed apart. Sums of fastest runs are steadier than whole-run medians on a shared host, but still
measure that host: compare within one run of this tool.

  tools/compare_layers.py /tmp/keel-peers/models/resnet50 --threads 1 --iters 20 [--top 40]
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import onnx

ORT_JS = r"""
const ort = require(process.argv[2]);
const fs = require('fs');
async function main() {
  const [model, threads, iters, prefix, shapeJson] = process.argv.slice(3);
  const s = await ort.InferenceSession.create(model, {executionProviders: ['cpu'], intraOpNumThreads: +threads,
    interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all', enableProfiling: true,
    profileFilePrefix: prefix});
  const feeds = {};
  const shapes = JSON.parse(shapeJson);
  for (const name of s.inputNames) {
    const dims = shapes[name];
    const n = dims.reduce((a, b) => a * b, 1);
    feeds[name] = new ort.Tensor('float32', Float32Array.from({length: n}, (_, i) => Math.sin(i) * 0.5), dims);
  }
  for (let i = 0; i < +iters; i++) await s.run(feeds);
  await s.release();
}
main().catch(e => { console.error(e); process.exit(1); });
"""

FUSED_INTO_PRODUCER = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Add", "Sum",
                       "BatchNormalization", "Mul", "Gelu", "Identity"}
ANCHORS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool", "LayerNormalization"}


def run(cmd, cpus, env=None):
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pin)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def keel_steps(keel, model, threads, iters, cpus):
    env = dict(os.environ, KEEL_ONEDNN_PROFILE="1")
    out = run([keel, "--log-level", "info", "--threads", str(threads), "bench", model, "--iters", str(iters),
               "--warmup", "3"], cpus, env)
    steps = collections.defaultdict(float)
    for line in out.splitlines():
        # "   12    0.148    0.178 ms     reorder jit:uni  /layer2/layer2.0/conv2/Conv [1,128,56,56] -> ..."
        m = re.match(r"\s+\d+\s+([\d.]+)\s+[\d.]+ ms\s+(?:1t\s+)?\S+ \S+\s+(\S+)", line)
        if m:
            steps[m.group(2)] += float(m.group(1))
    if not steps:
        raise RuntimeError("no steps table in Keel's output (is the model claimed by the oneDNN chain?):\n" + out[-2000:])
    return steps


def ort_nodes(ort_dir, model, threads, iters, cpus, shapes, work):
    js = os.path.join(work, "ort_profile.js")
    with open(js, "w") as f:
        f.write(ORT_JS)
    prefix = os.path.join(work, "ortprof")
    run(["node", js, os.path.join(ort_dir, "node_modules", "onnxruntime-node"), model, str(threads), str(iters + 3),
         prefix, json.dumps(shapes)], cpus)
    files = sorted(glob.glob(prefix + "*.json"))
    if not files:
        raise RuntimeError("ONNX Runtime wrote no profile")
    mins, ops = {}, {}
    for e in json.load(open(files[-1])):
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            n = e["name"][: -len("_kernel_time")]
            mins[n] = min(mins.get(n, 1e30), e["dur"] / 1e3)
            ops[n] = e.get("args", {}).get("op_name", "")
    return mins, ops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="a peers model folder (model.onnx) or an .onnx file")
    ap.add_argument("--keel", default="build/bin/keel")
    ap.add_argument("--ort-dir", default=os.path.join(os.environ.get("KEEL_PEERS_ROOT", "/tmp/keel-peers"), "ort"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=60, help="matched rows to print, slowest first (0: all, graph order)")
    ap.add_argument("--no-pin", action="store_true")
    a = ap.parse_args()
    model = a.model_dir if a.model_dir.endswith(".onnx") else os.path.join(a.model_dir, "model.onnx")
    g = onnx.load(model, load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    shapes = {}
    for i in g.input:
        if i.name in inits:
            continue
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
        shapes[i.name] = dims
    producer = {o: n for n in g.node for o in n.output}
    node_op = {n.name: n.op_type for n in g.node}

    def anchor_of(value):
        n = producer.get(value)
        while n is not None and n.op_type in FUSED_INTO_PRODUCER:
            data = [i for i in n.input if i and i not in inits and i in producer]
            # an Add of a residual: follow its last input produced by an anchor, else its first data input
            nxt = None
            for i in data:
                if producer[i].op_type in ANCHORS:
                    nxt = producer[i]
            if nxt is None and data:
                nxt = producer[data[0]]
            n = nxt
        return n.name if n is not None else None

    allowed = sorted(os.sched_getaffinity(0))
    cpus = None if a.no_pin else set(allowed[: a.threads])
    keel = os.path.abspath(a.keel)
    with tempfile.TemporaryDirectory(prefix="keel-layers-") as work:
        ks = keel_steps(keel, model, a.threads, a.iters, cpus)
        om, oo = ort_nodes(a.ort_dir, model, a.threads, a.iters, cpus, shapes, work)

    consumers = collections.defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    by_name = {n.name: n for n in g.node}

    def keel_step_for(name):
        """The Keel step that computes ONNX node `name`: its own, else one it was fused into (a pooling into the
        convolution before it; a shortcut convolution into the one whose residual Add reads both)."""
        if name in ks:
            return name
        n = by_name.get(name)
        if n is None:
            return None
        for i in n.input if n.op_type in ("MaxPool", "AveragePool") else []:  # a pooling fused after its producer
            if i in producer and i not in inits:
                a_ = anchor_of(i)
                if a_ in ks:
                    return a_
        for o in n.output:  # a sibling read by the same fused Add
            for c in consumers[o]:
                if c.op_type not in FUSED_INTO_PRODUCER:
                    continue
                for i in c.input:
                    if i != o and i in producer and i not in inits and anchor_of(i) in ks:
                        return anchor_of(i)
        return None

    ort_by_anchor = collections.defaultdict(float)
    ort_unmatched = {}
    for n, v in om.items():
        value = re.sub(r"_nchwc$", "", n)
        name = n if n in node_op else anchor_of(value) if value in producer else None
        if name is None:  # a node ORT made by fusing, named after the original one: "/.../MatMul/MatMulAddFusion"
            parts = n.split("/")
            for k in range(len(parts) - 1, 1, -1):
                if "/".join(parts[:k]) in node_op:
                    name = "/".join(parts[:k])
                    break
        step = keel_step_for(name) if name is not None else None
        if step is not None:
            ort_by_anchor[step] += v
        else:
            ort_unmatched[n] = v
    rows = [(k, kv, ort_by_anchor.get(k)) for k, kv in ks.items()]
    matched = [r for r in rows if r[2] is not None]
    keel_only = [r for r in rows if r[2] is None]
    order = {n.name: i for i, n in enumerate(g.node)}
    show = sorted(matched, key=lambda r: -max(r[1], r[2])) if a.top else sorted(matched, key=lambda r: order.get(r[0], 0))
    if a.top:
        show = show[: a.top]
    print(f"{os.path.basename(os.path.dirname(model)) or model}: {a.threads} thread(s), fastest of {a.iters} runs per "
          f"node{'' if a.no_pin else ', pinned to CPUs ' + ','.join(map(str, sorted(cpus)))}")
    print(f"{'node (Keel step name)':<58} {'keel ms':>8} {'ort ms':>8} {'ort/keel':>8}")
    for name, kv, ov in show:
        print(f"{name[:58]:<58} {kv:8.3f} {ov:8.3f} {ov / kv if kv > 0 else float('inf'):7.2f}x")
    mk, mo = sum(r[1] for r in matched), sum(r[2] for r in matched)
    print(f"{'matched (' + str(len(matched)) + ' nodes)':<58} {mk:8.3f} {mo:8.3f} {mo / mk if mk else 0:7.2f}x")
    if keel_only:
        print("Keel steps without an ORT node: " + ", ".join(f"{n} {v:.3f}" for n, v, _ in keel_only))
    if ort_unmatched:
        print("ORT nodes without a Keel step: " + ", ".join(f"{n} ({oo.get(n, '')}) {v:.3f}"
                                                         for n, v in ort_unmatched.items()))
    tk, to = sum(ks.values()), sum(om.values())
    print(f"{'all (sums of fastest runs)':<58} {tk:8.3f} {to:8.3f} {to / tk:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
