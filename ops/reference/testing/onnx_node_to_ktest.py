#!/usr/bin/python3
"""Converts ONNX backend node tests (one-node model.onnx + test_data_set_*/{input,output}_*.pb) into the small text
format that ops/reference/testing/smoke_test.cc reads (one .ktest file per test and data set).

Usage: /usr/bin/python3 onnx_node_to_ktest.py /usr/share/libonnx-testdata/data/node OUT_DIR [name-substring...]

Format (one item per line, numbers in decimal, float attributes as C99 hex floats, tensor bytes as hex, '-' = empty):
  op <op_type> <domain|-> <opset>
  attr <name> i <v> | f <hexfloat> | s <hex> | ints <n> v... | floats <n> v... | strings <n> hex... |
       t <dtype> <ndim> dims... <hex>
  in - | in <dtype> <ndim> dims... <hex>          (inputs in node order; '-' = omitted optional input)
  out - | out <dtype> <ndim> dims... <hex> <check>  (outputs in node order; check 0 = dtype only, not compared)
Tests that are not a single node over plain tensors are skipped.
"""
import glob
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper, TensorProto

NP_OF = {
    TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16, TensorProto.UINT16: np.uint16,
    TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32, TensorProto.INT64: np.int64,
    TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_,
}


def tensor_bytes(t):
    if t.data_type == TensorProto.BFLOAT16:
        if t.raw_data:
            return bytes(t.raw_data)
        return np.array(t.int32_data, dtype=np.uint16).tobytes()
    if t.data_type not in NP_OF:
        raise ValueError("dtype %d" % t.data_type)
    a = numpy_helper.to_array(t)
    return np.ascontiguousarray(a.astype(NP_OF[t.data_type])).tobytes()


def tensor_line(t, declared=None):
    # ONNX 1.12 test data stores bfloat16 tensors as uint16; relabel them with the declared type.
    if declared == TensorProto.BFLOAT16 and t.data_type == TensorProto.UINT16:
        t.data_type = TensorProto.BFLOAT16
        if not t.raw_data:
            t.raw_data = np.array(t.int32_data, dtype=np.uint16).tobytes()
            del t.int32_data[:]
    b = tensor_bytes(t)
    dims = list(t.dims)
    return "%d %d %s %s" % (t.data_type, len(dims), " ".join(str(d) for d in dims), b.hex() if b else "-")


def attr_line(a):
    A = onnx.AttributeProto
    if a.type == A.INT:
        return "attr %s i %d" % (a.name, a.i)
    if a.type == A.FLOAT:
        return "attr %s f %s" % (a.name, float(a.f).hex())
    if a.type == A.STRING:
        return "attr %s s %s" % (a.name, a.s.hex() if a.s else "-")
    if a.type == A.INTS:
        return "attr %s ints %d %s" % (a.name, len(a.ints), " ".join(str(v) for v in a.ints))
    if a.type == A.FLOATS:
        return "attr %s floats %d %s" % (a.name, len(a.floats), " ".join(float(v).hex() for v in a.floats))
    if a.type == A.STRINGS:
        return "attr %s strings %d %s" % (a.name, len(a.strings), " ".join(s.hex() if s else "-" for s in a.strings))
    if a.type == A.TENSOR:
        return "attr %s t %s" % (a.name, tensor_line(a.t))
    raise ValueError("attribute kind %d" % a.type)


def convert(test_dir, out_dir):
    model = onnx.load(os.path.join(test_dir, "model.onnx"))
    g = model.graph
    if len(g.node) != 1:
        return 0
    node = g.node[0]
    opset = 0
    for imp in model.opset_import:
        if imp.domain == node.domain or (imp.domain in ("", "ai.onnx") and node.domain in ("", "ai.onnx")):
            opset = imp.version
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
        else:
            types[vi.name] = None
    graph_inputs = [i.name for i in g.input]
    graph_outputs = [o.name for o in g.output]
    inits = {t.name: t for t in g.initializer}
    head = ["op %s %s %d" % (node.op_type, node.domain or "-", opset)]
    try:
        head += [attr_line(a) for a in node.attribute]
    except ValueError:
        return 0
    count = 0
    for ds in sorted(glob.glob(os.path.join(test_dir, "test_data_set_*"))):
        lines = list(head)
        try:
            for name in node.input:
                if name == "":
                    lines.append("in -")
                    continue
                if name in inits:
                    t = inits[name]
                else:
                    k = graph_inputs.index(name)
                    t = TensorProto()
                    with open(os.path.join(ds, "input_%d.pb" % k), "rb") as f:
                        t.ParseFromString(f.read())
                    if t.data_type == 0 or t.data_type == TensorProto.STRING:
                        return count
                lines.append("in " + tensor_line(t, types.get(name)))
            for name in node.output:
                if name == "":
                    lines.append("out -")
                    continue
                if name in graph_outputs:
                    k = graph_outputs.index(name)
                    t = TensorProto()
                    with open(os.path.join(ds, "output_%d.pb" % k), "rb") as f:
                        t.ParseFromString(f.read())
                    if t.data_type == 0 or t.data_type == TensorProto.STRING:
                        return count
                    lines.append("out " + tensor_line(t, types.get(name)) + " 1")
                else:
                    dt = types.get(name)
                    if not dt:
                        return count
                    lines.append("out %d 0 - 0" % dt)
        except (ValueError, FileNotFoundError, KeyError):
            return count
        name = os.path.basename(test_dir) + ("" if ds.endswith("_0") else "_" + os.path.basename(ds)[-1])
        with open(os.path.join(out_dir, name + ".ktest"), "w") as f:
            f.write("\n".join(lines) + "\n")
        count += 1
    return count


def main():
    src, out = sys.argv[1], sys.argv[2]
    subs = sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    n = 0
    for d in sorted(glob.glob(os.path.join(src, "test_*"))):
        if subs and not any(s in os.path.basename(d) for s in subs):
            continue
        try:
            n += convert(d, out)
        except Exception as e:  # a test we cannot express: skip it
            print("skip %s: %s" % (os.path.basename(d), e), file=sys.stderr)
    print("wrote %d tests to %s" % (n, out))


if __name__ == "__main__":
    main()
