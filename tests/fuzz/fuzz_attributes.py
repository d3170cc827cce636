#!/usr/bin/env python3
"""Fuzzes Keel's handling of operator attributes: one-node models of every op Keel registers, built from the op's
ONNX schema with random but well-typed attributes, input shapes and small constant inputs.

Each case picks an op of the reference kernel list (ops/reference/reference_kernels.cc: every op Keel runs) and an
opset (7-17) where ONNX defines it, then fills the schema: a type per type constraint, inputs (required ones and some
optional ones) as graph inputs of random shapes (plausible ones mostly: [N, C, H, W] for convolutions and pools;
sometimes zeros, empty tensors and mismatched ranks), integer inputs that act as attributes (axes, K, repeats, pads,
shape, split, starts/ends/steps, depth, indices, ...) as initializers with small, negative, zero or huge values, and
every attribute (required ones always, optional ones at random) with values of its type: 0, negatives, out-of-range
axes, huge values, wrong list lengths, unknown strings. Every case goes through `keel run` on every device (the
default placement, each non-cpu device type `keel plugins` lists, and the reference kernels alone: the binary run
with no plugin directory); a run passes when the process exits with a status (0 or an error), and fails on a signal,
a hang (timeout), a sanitizer report in its output (AddressSanitizer, LeakSanitizer, UBSan's "runtime error:") or a
crash over the memory cap (the process' address space is capped with RLIMIT_AS, or ASan's allocator for sanitizer
builds; an allocation over it must come back as an OUT_OF_MEMORY error, which is counted, not failed). Failing
models are kept with a one-line repro each.

Cases run in batches (--batch N, default 25): one `keel run --batch LIST` process runs N models in turn, each framed by
status lines, which saves the start-up of a process per case (seconds under ASan). A batch counts as a hang when no
frame line arrives for --timeout seconds. When a batch process does not finish cleanly (a signal, a sanitizer report,
a hang, a model without its end frame), its cases are run again one by one, each in its own process, to find the
culprit and keep it with its one-line repro; if none fails alone, the batch itself is kept (its list is the repro).

    python3 tests/fuzz/fuzz_attributes.py --keel build/bin/keel --cases 2000 --seed 1 --jobs 2 --keep /tmp/fuzz-attrs

Needs python3-onnx and python3-numpy (Debian packages; run it with /usr/bin/python3 where another python3 comes
first). The test suite runs a short, fixed-seed run of it (ctest -R fuzz_attributes).
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import onnx
from onnx import TensorProto, defs, helper, numpy_helper

# Ops that the fuzzer does not build (control flow and sequence ops need subgraphs or sequences; training optimizers
# live in another domain; Constant has no inputs worth fuzzing besides its value).
SKIP_OPS = {"If", "Loop", "Scan", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
            "SequenceLength", "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalHasElement",
            "OptionalGetElement", "Adagrad", "Adam", "Momentum", "StringNormalizer", "TfIdfVectorizer"}

CONV_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "MaxUnpool",
            "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "LRN", "InstanceNormalization", "BatchNormalization",
            "DepthToSpace", "SpaceToDepth", "GridSample", "RoiAlign", "Upsample", "Resize", "MeanVarianceNormalization"}
RNN_OPS = {"RNN", "GRU", "LSTM"}

# Integer inputs that act as attributes: how many values (a function of the data input's rank r).
SCALAR_INPUTS = {"K", "depth", "axis", "delta", "start", "limit", "size", "k", "dft_length", "frame_step",
                 "frame_length", "num_mel_bins", "sample_rate", "max_output_boxes_per_class", "lower_edge_hertz",
                 "upper_edge_hertz", "ratio", "training_mode"}
PER_AXIS_INPUTS = {"shape", "repeats", "axes", "starts", "ends", "steps", "split", "sizes", "output_shape", "input"}
INDEX_INPUTS = {"indices", "batch_indices", "target", "labels", "condition", "sequence_lens"}

ENUMS = {
    "auto_pad": ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"],
    "mode": ["constant", "reflect", "edge", "nearest", "linear", "cubic", "DCR", "CRD", "avg", "max", "bilinear",
             "bicubic"],
    "coordinate_transformation_mode": ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                       "tf_crop_and_resize", "output_half_pixel"],
    "nearest_mode": ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
    "direction": ["forward", "reverse", "bidirectional", "LEFT", "RIGHT"],
    "padding_mode": ["zeros", "border", "reflection"],
    "reduction": ["none", "sum", "mean", "add", "mul"],
    "equation": ["ij,jk->ik", "ii->i", "i,i", "...ij,...jk", "bij,bjk->bik", "ij->ji", "i->", "ab,bc,cd->ad", "->",
                 "ij,jk", "iij->", "a...b->b...a"],
}
# Per-op values where ops share an attribute name.
OP_ENUMS = {("Pad", "mode"): ["constant", "reflect", "edge"], ("Resize", "mode"): ["nearest", "linear", "cubic"],
            ("Upsample", "mode"): ["nearest", "linear", "bilinear"], ("DepthToSpace", "mode"): ["DCR", "CRD"],
            ("RoiAlign", "mode"): ["avg", "max"], ("GridSample", "mode"): ["bilinear", "nearest", "bicubic"],
            ("BitShift", "direction"): ["LEFT", "RIGHT"], ("RNN", "direction"): ["forward", "reverse", "bidirectional"],
            ("GRU", "direction"): ["forward", "reverse", "bidirectional"],
            ("LSTM", "direction"): ["forward", "reverse", "bidirectional"]}
FLAG_ATTRS = {"keepdims", "ceil_mode", "storage_order", "count_include_pad", "exclusive", "reverse", "transA", "transB",
              "select_last_index", "noop_with_empty_axes", "largest", "sorted", "fmod", "center_point_box",
              "align_corners", "onesided", "inverse", "upper", "allowzero", "new_axis", "layout", "input_forget",
              "linear_before_reset", "exclude_outside", "periodic", "saturate", "detect_negative", "detect_positive"}
ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
               "Softsign", "Softplus"]
# Element types the fuzzer picks first, in order of preference, when a constraint allows them.
TYPE_PREFERENCE = ["tensor(float)", "tensor(int64)", "tensor(int32)", "tensor(uint8)", "tensor(int8)", "tensor(bool)",
                   "tensor(double)", "tensor(float16)"]
ELEM = {"tensor(float)": TensorProto.FLOAT, "tensor(double)": TensorProto.DOUBLE, "tensor(float16)": TensorProto.FLOAT16,
        "tensor(bfloat16)": TensorProto.BFLOAT16, "tensor(int64)": TensorProto.INT64, "tensor(int32)": TensorProto.INT32,
        "tensor(int16)": TensorProto.INT16, "tensor(int8)": TensorProto.INT8, "tensor(uint8)": TensorProto.UINT8,
        "tensor(uint16)": TensorProto.UINT16, "tensor(uint32)": TensorProto.UINT32, "tensor(uint64)": TensorProto.UINT64,
        "tensor(bool)": TensorProto.BOOL, "tensor(string)": TensorProto.STRING}
NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
      TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.INT16: np.int16, TensorProto.INT8: np.int8,
      TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16, TensorProto.UINT32: np.uint32,
      TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_}
HUGE = [2**31, 2**31 - 1, 2**40, -2**40, 2**62, -2**63, 2**63 - 1]


def registered_ops(kernels_cc):
    """(op, since, end) of every ai.onnx entry of the reference kernel list."""
    text = open(kernels_cc).read()
    out = []
    for m in re.finditer(r'\{"(\w+)",\s*(\d+),\s*(\d+),\s*ref::\w+(?:,\s*"([\w.]*)")?\}', text):
        if m.group(4):
            continue  # another domain (training optimizers)
        out.append((m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def small_int(rng, r=3):
    x = rng.random()
    if x < 0.06:
        return rng.choice(HUGE)
    if x < 0.2:
        return rng.choice([0, -1, r, r + 1, -r - 1])
    return rng.randint(-2, 5)


class Case:
    def __init__(self, rng, op, opset):
        self.rng, self.op, self.opset = rng, op, opset
        self.schema = defs.get_schema(op, opset)
        self.inits, self.inputs, self.counter = [], [], 0
        self.w_shape = None

    def name(self):
        self.counter += 1
        return f"v{self.counter}"

    # -- shapes --
    def data_shape(self):
        rng = self.rng
        if self.op in CONV_OPS and rng.random() < 0.85:
            rank = rng.choice([4, 4, 4, 3, 5])
            return [rng.choice([1, 1, 2]), rng.choice([1, 2, 3, 4])] + [rng.choice([1, 2, 3, 5, 8, 0])
                                                                          if rng.random() < 0.1 else rng.choice([3, 5, 8])
                                                                          for _ in range(rank - 2)]
        if self.op in RNN_OPS and rng.random() < 0.85:
            return [rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 4)]
        rank = rng.choice([0, 1, 2, 2, 3, 3, 4, 4, 5])
        return [rng.choice([0, 1, 2, 3, 4, 5]) if rng.random() < 0.15 else rng.randint(1, 4) for _ in range(rank)]

    def mutate(self, shape):
        rng = self.rng
        x = rng.random()
        if x < 0.08:
            return shape[:-1] if shape else [1]
        if x < 0.14:
            return shape + [rng.randint(1, 3)]
        if x < 0.2 and shape:
            s = list(shape)
            s[rng.randrange(len(s))] = rng.choice([0, 1, 7])
            return s
        return shape

    def weight_shape(self, x):
        """A plausible weight for Conv-like ops (and RNN weights)."""
        rng = self.rng
        if self.op in RNN_OPS:
            gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[self.op]
            return [1, gates * self.hidden, x[-1] if x else 1]
        k = len(x) - 2 if len(x) >= 3 else 2
        cin = x[1] if len(x) > 1 else 1
        if self.op == "ConvTranspose":
            return [cin, rng.choice([1, 2])] + [rng.choice([1, 2, 3]) for _ in range(k)]
        return [rng.choice([1, 2, 4]), cin] + [rng.choice([1, 2, 3]) for _ in range(k)]

    def int_values(self, n, r):
        return [small_int(self.rng, r) for _ in range(n)]

    # -- inputs --
    def add_input(self, formal, elem, x_shape, index):
        rng = self.rng
        r = len(x_shape)
        nm = self.name()
        fname = formal.name
        is_int = elem in (TensorProto.INT64, TensorProto.INT32)
        if is_int and index > 0 and rng.random() < 0.85 and fname not in INDEX_INPUTS:
            if fname in SCALAR_INPUTS:
                v = np.array(small_int(rng, r) if rng.random() < 0.5 else [small_int(rng, r)])
            elif fname == "pads":
                v = np.array(self.int_values(rng.choice([2 * r, 2 * r, 2 * r, r, 2 * r + 2]), r))
            else:
                v = np.array(self.int_values(max(0, rng.choice([r, r, r, 1, r - 1, r + 1, 2])), r))
            try:
                self.inits.append(numpy_helper.from_array(v.astype(NP[elem]), nm))
            except OverflowError:
                self.inits.append(numpy_helper.from_array(np.array(v.clip(-2**31, 2**31 - 1)).astype(NP[elem]), nm))
            return nm
        if is_int and fname in INDEX_INPUTS and rng.random() < 0.7:
            shape = self.mutate(x_shape[: rng.randint(0, r)] if r else [])
            dim = max(x_shape) if x_shape else 1
            v = np.array([rng.randint(-dim - 1, dim) for _ in range(int(np.prod(shape)) if shape else 1)])
            v = v.reshape(shape) if shape else v.reshape(())
            self.inits.append(numpy_helper.from_array(v.astype(NP[elem]), nm))
            return nm
        if elem in (TensorProto.FLOAT,) and fname in ("scales", "roi") and rng.random() < 0.8:
            n = r if fname == "scales" else 2 * r
            vals = [rng.choice([0.0, -1.0, 0.5, 1.0, 2.0, 3.0, 1e10, float("nan")]) if rng.random() < 0.3
                    else rng.choice([1.0, 2.0, 0.5]) for _ in range(rng.choice([n, n, 0, n + 1]))]
            self.inits.append(numpy_helper.from_array(np.array(vals, dtype=np.float32), nm))
            return nm
        if fname in ("X", "input", "data", "A", "x", "T", "Q") or index == 0:
            shape = x_shape
        elif formal.name in ("W", "w") and (self.op in CONV_OPS or self.op in RNN_OPS):
            shape = self.weight_shape(x_shape)
            self.w_shape = shape
        elif formal.name == "B" and self.op in ("Conv", "ConvTranspose") and self.w_shape and rng.random() < 0.8:
            shape = [self.w_shape[0] if self.op == "Conv" else self.w_shape[1]]
        elif formal.name in ("R",) and self.op in RNN_OPS:
            shape = [1, {"RNN": 1, "GRU": 3, "LSTM": 4}[self.op] * self.hidden, self.hidden]
        elif rng.random() < 0.5:
            shape = list(x_shape)
        elif rng.random() < 0.5 and x_shape:
            shape = x_shape[rng.randint(0, len(x_shape)):]
        else:
            shape = self.data_shape()
        shape = self.mutate(shape) if index > 0 else shape
        shape = [max(0, min(d, 16)) for d in shape]
        if rng.random() < 0.08:
            # Dims unknown at load (keel run feeds 1): the checks that need them run only in the kernels.
            shape = [f"d{nm}_{k}" for k in range(len(shape))]
        self.inputs.append(helper.make_tensor_value_info(nm, elem, shape))
        return nm

    # -- attributes --
    def tame_value(self, a, rank):
        """A plausible value (None: no idea), so that a tame case mostly reaches the kernels with one odd value."""
        rng = self.rng
        T = defs.OpSchema.AttrType
        if a.name in FLAG_ATTRS and a.type == T.INT:
            return rng.choice([0, 1])
        if a.name in ("axis", "batch_axis") and a.type == T.INT:
            return rng.randint(-max(rank, 1), max(rank - 1, 0))
        if a.name == "axes" and a.type == T.INTS and rank > 0:
            return sorted(rng.sample(range(rank), rng.randint(1, rank)))
        if a.name == "perm" and a.type == T.INTS:
            p = list(range(rank))
            rng.shuffle(p)
            return p
        if a.type == T.STRING:
            values = OP_ENUMS.get((self.op, a.name)) or ENUMS.get(a.name)
            return rng.choice(values) if values else None
        if a.type == T.INT and a.name in ("group", "blocksize", "size", "p", "hidden_size", "sample_size", "k"):
            return self.hidden if a.name == "hidden_size" else rng.choice([1, 1, 2, 3])
        return None

    def attr_value(self, a, rank):
        rng = self.rng
        spatial = max(rank - 2, 1)
        T = defs.OpSchema.AttrType
        if self.tame and rng.random() < 0.85:
            v = self.tame_value(a, rank)
            if v is not None:
                return v
        if a.name in ("to", "dtype", "output_datatype"):
            return rng.choice([1, 1, 6, 7, 9, 10, 11, 2, 3, 0, 8, 99, -1])
        if a.type == T.INT:
            if a.name == "hidden_size":
                return self.hidden if rng.random() < 0.7 else rng.choice([0, -1, 2**31, 1])
            return small_int(rng, rank)
        if a.type == T.INTS and self.op in CONV_OPS and rng.random() < 0.7:
            # Mostly plausible geometry, so that kernels run; the rest of the time anything below.
            if a.name == "kernel_shape":
                return list(self.w_shape[2:]) if self.w_shape and len(self.w_shape) > 2 else \
                    [rng.choice([1, 2, 3]) for _ in range(spatial)]
            if a.name in ("strides", "dilations"):
                return [rng.choice([1, 1, 2, 3]) for _ in range(spatial)]
            if a.name == "pads":
                return [rng.choice([0, 0, 1, 2]) for _ in range(2 * spatial)]
            if a.name == "output_padding":
                return [rng.choice([0, 0, 1]) for _ in range(spatial)]
        if a.type == T.INT and self.op in CONV_OPS and a.name == "group" and rng.random() < 0.7:
            return rng.choice([1, 1, 2])
        if a.type == T.INTS:
            n = rng.choice([spatial, spatial, 2 * spatial, rank, 0, 1, 3])
            if a.name == "pads":
                n = rng.choice([2 * spatial, 2 * spatial, 2 * rank, spatial, 1])
            if a.name in ("kernel_shape", "strides", "dilations") and rng.random() < 0.6:
                return [rng.choice([1, 1, 2, 3]) if rng.random() < 0.85 else rng.choice([0, -1, 2**31, 2**62])
                        for _ in range(n)]
            if a.name == "perm" and rng.random() < 0.5:
                p = list(range(rank))
                rng.shuffle(p)
                return p
            return self.int_values(n, rank)
        if a.type == T.FLOAT:
            return rng.choice([0.0, 1.0, -1.0, 0.5, 1e-5, 1e30, float("nan"), float("inf"), rng.uniform(-3, 3)])
        if a.type == T.FLOATS:
            n = rng.choice([rank, rank, 0, 1, rank + 1])
            return [rng.choice([0.0, 1.0, 2.0, -1.0, 0.5, float("nan")]) for _ in range(n)]
        if a.type == T.STRING:
            values = OP_ENUMS.get((self.op, a.name)) or ENUMS.get(a.name)
            if values and rng.random() < 0.9:
                return rng.choice(values)
            return rng.choice(["", "bogus", "NOTSET", "x" * 40])
        if a.type == T.STRINGS:
            if a.name == "activations":
                return [rng.choice(ACTIVATIONS) for _ in range(rng.choice([1, 2, 3, 4, 6, 0]))]
            return [rng.choice(["a", "b", ""]) for _ in range(rng.randint(0, 3))]
        if a.type == T.TENSOR:
            shape = [rng.randint(0, 3) for _ in range(rng.randint(0, 2))]
            dtype = rng.choice([np.float32, np.int64, np.int32])
            return numpy_helper.from_array(np.array(rng.randint(-3, 3), dtype=dtype) if not shape
                                           else np.full(shape, rng.randint(-3, 3), dtype=dtype))
        return None  # graphs, sparse tensors, type protos: not generated

    def build(self):
        rng, s = self.rng, self.schema
        self.hidden = rng.randint(1, 4)
        self.tame = rng.random() < 0.5  # most attributes plausible (one or two odd values reach the kernels)
        # A type per constraint parameter.
        types = {}
        for tc in s.type_constraints:
            allowed = [t for t in tc.allowed_type_strs if t in ELEM and t != "tensor(string)"]
            if not allowed:
                return None
            pref = [t for t in TYPE_PREFERENCE if t in allowed]
            types[tc.type_param_str] = rng.choice(allowed) if rng.random() < 0.15 or not pref else pref[0]

        def elem_of(formal):
            t = types.get(formal.typeStr, formal.typeStr)
            return ELEM.get(t)

        x_shape = self.data_shape()
        names = []
        formals = list(s.inputs)
        for i, f in enumerate(formals):
            opt = f.option == defs.OpSchema.FormalParameterOption.Optional
            variadic = f.option == defs.OpSchema.FormalParameterOption.Variadic
            elem = elem_of(f)
            if elem is None:
                return None
            if opt and rng.random() < 0.5:
                names.append("")
                continue
            for _ in range(rng.randint(1, 3) if variadic else 1):
                names.append(self.add_input(f, elem, x_shape, i))
        while names and names[-1] == "":
            names.pop()
        if len(names) < s.min_input:
            return None
        attrs = {}
        for a in s.attributes.values():
            if a.required or rng.random() < 0.6:
                v = self.attr_value(a, len(x_shape))
                if v is None:
                    if a.required:
                        return None
                    continue
                attrs[a.name] = v
        # The checker wants graph outputs with a shape, and the outputs' ranks are what is being fuzzed: the graph
        # outputs are Shape(y_i) (int64, one dim of unknown length); the op still runs.
        outs, out_infos, shapes = [], [], []
        n_out = rng.randint(s.min_output, min(s.max_output, max(s.min_output, len(s.outputs)), 3))
        for i in range(n_out):
            outs.append(f"y{i}")
            shapes.append(helper.make_node("Shape", [f"y{i}"], [f"s{i}"], name=f"shape{i}"))
            out_infos.append(helper.make_tensor_value_info(f"s{i}", TensorProto.INT64, ["n"]))
        node = helper.make_node(self.op, names, outs, name="n0", **attrs)
        graph = helper.make_graph([node] + shapes, "attr_fuzz", self.inputs, out_infos, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model


def op_weight(op):
    """Ops with more attributes (and attribute-like inputs) get more cases."""
    try:
        s = defs.get_schema(op, 17)
    except Exception:  # noqa: BLE001 - not in opset 17
        return 1
    return 1 + len(s.attributes) + sum(1 for f in s.inputs if f.name in SCALAR_INPUTS | PER_AXIS_INPUTS | {"pads"})


def make_case(rng, ops, weights):
    for _ in range(100):
        op, since, end = rng.choices(ops, weights)[0]
        lo, hi = max(7, since), min(17, end or 17)
        if lo > hi:
            continue
        opset = rng.randint(lo, hi)
        try:
            schema = defs.get_schema(op, opset)
        except Exception:
            continue
        if schema.deprecated or schema.since_version < since:
            continue
        model = Case(rng, op, opset).build()
        if model is not None:
            return op, opset, model
    raise RuntimeError("no op could be built")


# A sanitizer's report. Not its allocator's "WARNING: AddressSanitizer failed to allocate 0x... bytes": with
# allocator_may_return_null (set below) that is the memory cap refusing an allocation, which keel then reports as
# OUT_OF_MEMORY (counted as such, not failed).
SANITIZER = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer|ThreadSanitizer)|"
                       r"WARNING: (AddressSanitizer|LeakSanitizer|ThreadSanitizer)(?! failed to allocate)|runtime error:")


def run_one(cmd, env, timeout, mem_cap):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env,
                           preexec_fn=limit_child(mem_cap))
    except subprocess.TimeoutExpired:
        return f"no exit after {timeout:.0f} s", "hang"
    out = r.stdout + r.stderr
    if r.returncode < 0:
        return f"signal {-r.returncode}", out[-2000:]
    if r.returncode >= 128 and r.returncode - 128 in (4, 6, 7, 8, 11):
        return f"exit {r.returncode} (signal {r.returncode - 128})", out[-2000:]
    m = SANITIZER.search(out)
    if m:
        line = out[m.start():].splitlines()[0]
        return f"sanitizer: {line[:200]}", out[-4000:]
    if r.returncode == 0:
        return None, "ok"
    if "out of memory" in out.lower() or "OUT_OF_MEMORY" in out:
        return None, "oom"
    return None, "error"


def limit_child(mem_cap):
    def limit():
        if mem_cap:
            resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return limit


FRAME = re.compile(r"^keel-batch: (start|end) (\d+)(?: rc=(-?\d+))?")


def run_batch(cmd, env, timeout, mem_cap):
    """Runs `keel run --batch LIST` (cmd); returns (per-model list of (verdict, detail) or None where the model has no
    end frame, the process' problem or None, the whole output's tail). A model's verdict is as in run_one."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env,
                         preexec_fn=limit_child(mem_cap))
    lines, last = [], [time.monotonic()]

    def read():
        for line in p.stdout:
            lines.append(line)
            if line.startswith("keel-batch: "):
                last[0] = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    hung = False
    while True:
        try:
            p.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() - last[0] > timeout:
                hung = True
                p.kill()
                p.wait()
                break
    reader.join(timeout=10)
    out = "".join(lines)
    results, start, segment = {}, None, []
    for line in lines:
        m = FRAME.match(line)
        if not m:
            segment.append(line)
            continue
        k = int(m.group(2))
        if m.group(1) == "start":
            start, segment = k, []
            continue
        if k != start:
            continue
        text = "".join(segment)
        rc = int(m.group(3))
        sm = SANITIZER.search(text)
        if sm:
            results[k] = (f"sanitizer: {text[sm.start():].splitlines()[0][:200]}", text[-4000:])
        elif rc == 0:
            results[k] = (None, "ok")
        elif "out of memory" in text.lower() or "OUT_OF_MEMORY" in text:
            results[k] = (None, "oom")
        else:
            results[k] = (None, "error")
        start = None
    problem = None
    if hung:
        problem = f"no frame line for {timeout:.0f} s"
    elif p.returncode < 0:
        problem = f"signal {-p.returncode}"
    elif p.returncode != 0:
        problem = f"exit {p.returncode}"
    elif SANITIZER.search(out):
        problem = "sanitizer report"
    return results, problem, out[-4000:]


def copy_tree_of(keel, dest, plugins):
    """Copies the keel binary, its libkeel* libraries and (with `plugins`) the plugin folder into dest/{bin,lib}."""
    keel_abs = os.path.realpath(keel)
    libdir = os.path.join(os.path.dirname(os.path.dirname(keel_abs)), "lib")
    os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
    os.makedirs(os.path.join(dest, "lib"), exist_ok=True)
    shutil.copy2(keel_abs, os.path.join(dest, "bin", "keel"))
    for f in os.listdir(libdir) if os.path.isdir(libdir) else []:
        p = os.path.join(libdir, f)
        if f.startswith("libkeel") and ".so" in f and (os.path.isfile(p) or os.path.islink(p)):
            target = os.path.join(dest, "lib", f)
            if os.path.lexists(target):
                os.remove(target)
            shutil.copy2(p, target, follow_symlinks=False)
    if plugins and os.path.isdir(os.path.join(libdir, "keel", "plugins")):
        shutil.copytree(os.path.join(libdir, "keel", "plugins"), os.path.join(dest, "lib", "keel", "plugins"),
                        dirs_exist_ok=True)
    return os.path.join(dest, "bin", "keel")


def device_runs(keel, env, workdir):
    """(label, binary argv, extra run options, env) per way to run: the default placement, every non-cpu device, the reference kernels."""
    runs = [("default", [keel], [], env)]
    try:
        r = subprocess.run([keel, "plugins", "--json"], capture_output=True, text=True, timeout=120, env=env)
        info = json.loads(r.stdout)
        # cpu is the default placement; null is the vendors' skeleton (every kernel UNIMPLEMENTED: all falls back).
        devices = {d.get("type") for d in info.get("devices", [])} - {"cpu", "null", None}
        for d in sorted(devices):
            runs.append((d, [keel], ["--device", d], env))
    except Exception as e:  # noqa: BLE001 - the listing is best effort
        print(f"note: `keel plugins --json` failed ({e}); running the default placement and the reference only",
              file=sys.stderr)
    # The reference kernels alone: a copy of the binary and its libraries where no plugin directory is beside them
    # (LD_LIBRARY_PATH precedes the binary's RUNPATH; HOME and KEEL_PLUGIN_PATH point nowhere).
    ref = os.path.join(workdir, "reference-kernels")
    copy_tree_of(keel, ref, plugins=False)
    renv = dict(env, LD_LIBRARY_PATH=os.path.join(ref, "lib") + ":" + env.get("LD_LIBRARY_PATH", ""),
                HOME=os.path.join(ref, "home"), KEEL_PLUGIN_PATH="")
    r = subprocess.run([os.path.join(ref, "bin", "keel"), "plugins", "--json"], capture_output=True, text=True,
                       timeout=120, env=renv)
    loaded = []
    try:
        loaded = [p["name"] for p in json.loads(r.stdout)["plugins"] if p.get("state") == "loaded"]
    except Exception:  # noqa: BLE001
        loaded = ["?"]
    if r.returncode == 0 and loaded == ["reference"]:
        runs.append(("reference", [os.path.join(ref, "bin", "keel")], [], renv))
    else:
        print("note: could not isolate the reference kernels (plugins still load); skipping that run", file=sys.stderr)
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--keel", default="build/bin/keel", help="the keel binary")
    ap.add_argument("--kernels", default=os.path.join(here, "..", "..", "ops", "reference", "reference_kernels.cc"),
                    help="the reference kernel list (the ops to fuzz)")
    ap.add_argument("--ops", default="", help="comma list: fuzz only these ops")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--passes", default="none", help="the --passes value of every run")
    ap.add_argument("--devices", default="all", help="all, or a comma list of: default, reference, <device type>")
    ap.add_argument("--keep", default=None, help="folder for failing models (default: a new temporary folder)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take before it counts as a hang")
    ap.add_argument("--mem-cap-mb", type=int, default=6144,
                    help="address-space cap per run (RLIMIT_AS; for ASan builds, ASan's allocator cap); 0 = none")
    ap.add_argument("--batch", type=int, default=25,
                    help="models per `keel run --batch` process (1: a process per model, as before)")
    ap.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    ap.add_argument("--snapshot", action="store_true",
                    help="run a copy of the binary, libraries and plugins (in the keep folder), so that a rebuild "
                         "of the build tree during a long run does not change what is fuzzed")
    args = ap.parse_args()

    keep = args.keep or tempfile.mkdtemp(prefix="keel-attr-fuzz-")
    os.makedirs(keep, exist_ok=True)
    work = tempfile.mkdtemp(prefix="keel-attr-fuzz-work-")
    env = dict(os.environ)
    env.setdefault("KEEL_LOG_LEVEL", "error")
    mem_cap = args.mem_cap_mb * (1 << 20)
    ldd = subprocess.run(["ldd", args.keel], capture_output=True, text=True).stdout
    if "libasan" in ldd:
        # ASan reserves terabytes of address space: cap its allocator instead, and let it return null (bad_alloc).
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + f":allocator_may_return_null=1:max_allocation_size_mb="
                               f"{args.mem_cap_mb}:detect_leaks=0:abort_on_error=0").lstrip(":")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        mem_cap = 0
    elif "libtsan" in ldd:
        # TSan maps its shadow memory at fixed, huge ranges (a capped address space kills it at start): the same cap
        # through its allocator. Its reports are found in the output like ASan's.
        env["TSAN_OPTIONS"] = (env.get("TSAN_OPTIONS", "") + f":allocator_may_return_null=1:max_allocation_size_mb="
                               f"{args.mem_cap_mb}").lstrip(":")
        mem_cap = 0
    ops = registered_ops(args.kernels)
    if args.ops:
        wanted = set(args.ops.split(","))
        ops = [o for o in ops if o[0] in wanted]
    ops = [o for o in ops if o[0] not in SKIP_OPS]
    keel = args.keel
    if args.snapshot:
        keel = copy_tree_of(args.keel, os.path.join(keep, "snapshot"), plugins=True)
    runs = device_runs(keel, env, keep)  # the reference copy stays beside the kept models (their repros use it)
    if args.devices != "all":
        wanted = set(args.devices.split(","))
        runs = [r for r in runs if r[0] in wanted]
    print(f"{len(ops)} ops; runs per case: {', '.join(r[0] for r in runs)}; failing models go to {keep}",
          file=sys.stderr, flush=True)

    rng = random.Random(args.seed)
    weights = [op_weight(o[0]) for o in ops]
    cases = []
    for i in range(args.cases):
        op, opset, model = make_case(rng, ops, weights)
        path = os.path.join(work, f"case_{args.seed}_{i}_{op}_op{opset}.onnx")
        onnx.save(model, path)
        cases.append((i, op, path))

    stats = {"ok": 0, "error": 0, "oom": 0}
    failures = []

    def single_cmd(argv, extra, path):
        return argv + ["run", path] + extra + ["--passes", args.passes, "--print", "0", "--threads", "1"]

    def job(unit):
        """One run way over a chunk of cases: (case, label, cmd, verdict, detail) per model, plus a (None, ...) entry
        for a batch that failed with no single culprit."""
        label, argv, extra, renv, chunk, b = unit
        out = []
        if len(chunk) == 1:
            case = chunk[0]
            cmd = single_cmd(argv, extra, case[2])
            return [(case, label, cmd) + run_one(cmd, renv, args.timeout, mem_cap)]
        listfile = os.path.join(work, f"batch_{label}_{b}.txt")
        with open(listfile, "w") as f:
            f.write("".join(c[2] + "\n" for c in chunk))
        bcmd = argv + ["run", "--batch", listfile] + extra + ["--passes", args.passes, "--print", "0", "--threads", "1"]
        results, problem, tail = run_batch(bcmd, renv, args.timeout, mem_cap)
        if problem is None and len(results) == len(chunk):
            return [(case, label, single_cmd(argv, extra, case[2])) + results[k] for k, case in enumerate(chunk)]
        # Something ended the batch early (or hung it): every case again, alone.
        culprit = False
        for case in chunk:
            cmd = single_cmd(argv, extra, case[2])
            verdict, detail = run_one(cmd, renv, args.timeout, mem_cap)
            culprit = culprit or verdict is not None
            out.append((case, label, cmd, verdict, detail))
        if not culprit:
            out.append((None, label, bcmd, f"batch: {problem or 'models without an end frame'}, no model fails alone",
                        tail))
        return out

    size = max(1, args.batch)
    units = [(label, argv, extra, renv, cases[j:j + size], j // size)
             for j in range(0, len(cases), size) for (label, argv, extra, renv) in runs]
    failing_paths = set()
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for results in ex.map(job, units):
            for case, label, cmd, verdict, detail in results:
                if verdict is None:
                    stats[detail] += 1
                    continue
                env_prefix = ""
                if label == "reference":
                    env_prefix = "LD_LIBRARY_PATH=" + os.path.dirname(os.path.dirname(cmd[0])) + "/lib HOME=/nonexistent "
                if case is None:  # a batch: keep its models and a list naming the kept copies
                    listfile = cmd[cmd.index("--batch") + 1]
                    bdir = os.path.join(keep, os.path.splitext(os.path.basename(listfile))[0])
                    os.makedirs(bdir, exist_ok=True)
                    kept_paths = [shutil.copy2(p.strip(), bdir) for p in open(listfile) if p.strip()]
                    kept_list = os.path.join(bdir, "list.txt")
                    with open(kept_list, "w") as f:
                        f.write("".join(k + "\n" for k in kept_paths))
                    repro = env_prefix + " ".join(cmd).replace(listfile, kept_list)
                    op = "(batch)"
                else:
                    i, op, path = case
                    kept = os.path.join(keep, os.path.basename(path))
                    shutil.copy2(path, kept)
                    failing_paths.add(path)
                    repro = env_prefix + " ".join(cmd).replace(path, kept)
                print(f"FAIL ({verdict}) {op} [{label}]: {repro}", flush=True)
                if not args.quiet:
                    print("    " + "\n    ".join(str(detail).splitlines()[-6:]), flush=True)
                failures.append((op, label, verdict, repro))
            done += 1
            if not args.quiet and (done * size) // (100 * len(runs)) != ((done - 1) * size) // (100 * len(runs)):
                print(f"~{min(args.cases, done * size // len(runs))}/{args.cases} cases, {len(failures)} failing runs",
                      file=sys.stderr, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    if not failures:  # nothing to reproduce: drop the copies of the binary (and the folder, when it was ours)
        for d in ("reference-kernels", "snapshot"):
            shutil.rmtree(os.path.join(keep, d), ignore_errors=True)
        if not args.keep:
            shutil.rmtree(keep, ignore_errors=True)
            keep = "(none)"
    total = sum(stats.values()) + len(failures)
    print(f"{args.cases} cases, {total} runs: {stats['ok']} ran to the end, {stats['error']} refused with an error, "
          f"{stats['oom']} refused an allocation over the cap, {len(failures)} failed; failing models kept in {keep}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
