#!/usr/bin/env python3
"""Fuzzes `keel serve`'s dynamic batcher: concurrent requests on random models must get what they get alone.

Each case is a random chain (`keel-cts --random-chains 1 --seed S --save DIR`: 2-6 blocks of CNN or transformer-like
ops) whose inputs have a dynamic batch dim, or batch 1 (then served with `dynamic_batch = true`), or a fixed batch
above 1 (then served without batching, every request of that many rows, no probe). One `keel serve` process on
127.0.0.1 (a free port, `--model-control`) loads each case twice, in turn: as `bN` with a random batcher
(max_batch_size 4-16, max_queue_delay_us, preferred batch sizes, 1-2 instances of 1-2 threads; a fifth of the cases in
bf16, the reference too) and as `rN`, the reference, with no queue delay and only ever one request at a time. A model
that fixes its batch inside, or whose rows change each other, is refused at load (400, the server's check of a batch
of 2 rows: zeros, then random rows against each row alone) and counted "unbatchable". A probe checks that check: a
request of 2 rows to the reference and each row alone must agree, else the server batches a model whose answers
depend on their neighbours (a failure); so every difference after it is the batcher's. Then 16-32 requests of 1-3 rows go to `bN` at once from several
threads, in JSON (flat or nested data) or with the binary tensor extension, each asking for all outputs or some of
them, binary or not, with an `id`; about one in six is bad on purpose (a wrong datatype, a wrong fixed dim, more rows
than max_batch_size, data of the wrong length) and must get 400 without disturbing the requests batched with it; one
in twenty is abandoned (half its body sent, then the connection closed) and one in twenty has a queue deadline of 1 us
(served, or 504); in one case of four a version 2 of `bN` (the same file) is loaded in the middle of the burst, which
must lose none of the requests version 1 accepted. Every good request is then sent alone to `rN`; the two answers must
agree (outputs and their shapes, the id, values within a relative L2 error of --tolerance, 3e-2 in bf16). Fails on a
server that dies, a request that hangs, a 5xx for a good request, a bad one not refused, or a difference; the case's
repository and requests are kept with `--keep DIR`.

    /usr/bin/python3 tests/fuzz/fuzz_serve.py --build build --cases 40 --seed 1

Needs python3-onnx and python3-numpy (Debian packages). The test suite runs a short, fixed-seed run (ctest -R
fuzz_serve).
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import onnx

# numpy dtype <-> KServe v2 datatype
KSERVE = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.float16): "FP16",
          np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.int8): "INT8",
          np.dtype(np.uint8): "UINT8", np.dtype(np.bool_): "BOOL"}
NUMPY = {v: k for k, v in KSERVE.items()}
ONNX_TO_NUMPY = {1: np.float32, 11: np.float64, 10: np.float16, 7: np.int64, 6: np.int32, 3: np.int8, 2: np.uint8,
                 9: np.bool_}


class ServerDied(Exception):
    pass


def model_io(path):
    """([(name, numpy dtype, dims: int or None for dynamic)], [output names]) of the model's graph."""
    m = onnx.load(path)
    inits = {i.name for i in m.graph.initializer}
    ins = []
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        ins.append((i.name, np.dtype(ONNX_TO_NUMPY.get(t.elem_type, np.float32)), dims))
    return ins, [o.name for o in m.graph.output]


def mix_rows(path, out_path):
    """Writes a copy of the model whose first float output becomes itself minus its mean over dim 0 (rows that change
    each other, as a BatchNormalization exported in training mode makes them); that output's name, or None when no
    output is a float tensor made by a node."""
    m = onnx.load(path)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
    made = {x for n in m.graph.node for x in n.output}
    name = next((o.name for o in m.graph.output if o.type.tensor_type.elem_type in floats and o.name in made), None)
    if name is None:
        return None
    raw = name + "__unmixed"
    for n in m.graph.node:
        n.output[:] = [raw if x == name else x for x in n.output]
        n.input[:] = [raw if x == name else x for x in n.input]
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 17)
    if opset >= 18:  # ReduceMean's axes became an input
        m.graph.initializer.append(onnx.helper.make_tensor(raw + "_axes", onnx.TensorProto.INT64, [1], [0]))
        mean = onnx.helper.make_node("ReduceMean", [raw, raw + "_axes"], [raw + "_mean"])
    else:
        mean = onnx.helper.make_node("ReduceMean", [raw], [raw + "_mean"], axes=[0])
    m.graph.node.extend([mean, onnx.helper.make_node("Sub", [raw, raw + "_mean"], [name])])
    onnx.save(m, out_path)
    return name


def draw(rng, dtype, shape):
    if np.issubdtype(dtype, np.integer):  # token ids: small non-negative values, as the chain's embedding takes
        return rng.integers(0, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def make_body(r, inputs, arrays, outputs, binary_in, binary_out, rid):
    """(body bytes, extra headers) of a KServe v2 infer request."""
    head = {"id": rid, "inputs": []}
    tail = b""
    for (name, _, _), a in zip(inputs, arrays):
        d = KSERVE[a.dtype]
        e = {"name": name, "datatype": d, "shape": list(a.shape)}
        if binary_in:
            raw = a.tobytes()
            e["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            e["data"] = a.tolist() if r.random() < 0.5 else a.ravel().tolist()
        head["inputs"].append(e)
    if outputs is not None:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": binary_out}} for o in outputs]
    elif binary_out:
        head["parameters"] = {"binary_data_output": True}
    js = json.dumps(head).encode()
    if binary_in or tail:
        return js + tail, {"Inference-Header-Content-Length": str(len(js))}
    return js, {}


def rewrite_header(body, headers, edit):
    """The request with edit(its JSON header) applied, binary part kept."""
    hl = int(headers["Inference-Header-Content-Length"]) if headers else len(body)
    js = json.loads(body[:hl])
    edit(js)
    head = json.dumps(js).encode()
    if headers:
        return head + body[hl:], {"Inference-Header-Content-Length": str(len(head))}
    return head, {}


def parse_answer(status, headers, body):
    """(status, id or None, {output name: array}) of an infer answer; raises ValueError on a malformed one."""
    hl = headers.get("Inference-Header-Content-Length")
    js = json.loads(body[:int(hl)] if hl else body)
    if status != 200:
        if "error" not in js:
            raise ValueError(f"status {status} without an error field: {body[:200]!r}")
        return status, None, {}
    outs = {}
    offset = int(hl) if hl else 0
    for o in js["outputs"]:
        dt = NUMPY[o["datatype"]]
        size = o.get("parameters", {}).get("binary_data_size")
        if size is not None:
            a = np.frombuffer(body[offset:offset + size], dtype=dt)
            offset += size
        else:
            a = np.array(o["data"], dtype=dt)
        outs[o["name"]] = a.reshape(o["shape"])
    return status, js.get("id"), outs


def post(port, path, body, headers, timeout):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers)
        c.request("POST", path, body=body, headers=h)
        resp = c.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        c.close()


def abandon(port, path, body, headers):
    """Sends the request's headers and half its body, then closes the connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.putrequest("POST", path)
        h = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        h.update(headers)
        for k, v in h.items():
            c.putheader(k, v)
        c.endheaders()
        c.send(body[:len(body) // 2])
    finally:
        c.close()


def get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        resp = c.getresponse()
        return resp.status, resp.read()
    finally:
        c.close()


def rel_err(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if a64.size == 0:
        return 0.0
    if not np.array_equal(np.isfinite(a64), np.isfinite(b64)):
        return float("inf")
    f = np.isfinite(a64)
    return float(np.linalg.norm(a64[f] - b64[f]) / max(np.linalg.norm(b64[f]), 1e-6))


def compare(got, want, tol):
    """None if the answers agree, else what differs."""
    if set(got) != set(want):
        return f"outputs {sorted(got)} instead of {sorted(want)}"
    for k in want:
        if got[k].shape != want[k].shape:
            return f"output {k}: shape {got[k].shape} instead of {want[k].shape}"
        if got[k].dtype != want[k].dtype:
            return f"output {k}: dtype {got[k].dtype} instead of {want[k].dtype}"
        e = rel_err(got[k], want[k])
        if e > tol:
            return f"output {k}: relative L2 error {e:.3g} > {tol}"
    return None


class Server:
    def __init__(self, keel, repo, log_path):
        self.log = open(log_path, "w")
        self.p = subprocess.Popen([keel, "--threads", "1", "serve", "--model-repository", repo, "--host", "127.0.0.1",
                                   "--port", "0", "--http-threads", "16", "--io-timeout", "20", "--model-control"],
                                  stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        deadline = time.time() + 120
        for line in self.p.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        if self.port is None:
            self.stop()
            raise ServerDied("keel serve did not start (see its log)")
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode


def prepare(args, seed, stage, rng):
    """The case's model folders (in `stage`, copied into the repository when its turn comes) and its plan, or (None,
    reason) when the chain has no batch dim to serve."""
    case = os.path.join(stage, "cases", f"c{seed}")
    rc = subprocess.run([os.path.join(args.build, "bin", "keel-cts"), "--random-chains", "1", "--seed", str(seed),
                         "--save", case], capture_output=True, text=True, timeout=120).returncode
    if rc != 0:
        return None, "keel-cts --save failed"
    model = os.path.join(case, "model.onnx")
    ins, outs = model_io(model)
    if not ins or any(len(d) == 0 for _, _, d in ins):
        return None, "an input without a batch dim"
    dynamic = all(d[0] is None for _, _, d in ins)
    fixed = None  # a batch > 1 that the model fixes: served without batching, every request of that many rows
    if not dynamic and not all(d[0] == 1 for _, _, d in ins):
        firsts = {d[0] for _, _, d in ins}
        if len(firsts) != 1 or None in firsts:
            return None, "inputs of different first dims"
        fixed = firsts.pop()
    # One case in eight (with a batch to share) gets rows that change each other: the server must refuse to batch it.
    mixed = None
    if fixed is None and rng.random() < 0.125:
        mixed = mix_rows(model, os.path.join(case, "mixed.onnx"))
        if mixed is not None:
            model = os.path.join(case, "mixed.onnx")
    max_batch = rng.choice([4, 8, 16])
    batched = [f"max_batch_size = {max_batch}",
               f"max_queue_delay_us = {rng.choice([500, 2000, 10000, 30000])}",
               f"instances = {rng.choice([1, 1, 2])}", f"threads = {rng.choice([1, 1, 1, 2])}"]
    if rng.random() < 0.4:
        batched.append(f"preferred_batch_sizes = {sorted(rng.sample([2, 3, 4], rng.randint(1, 2)))}")
    reference = ["max_batch_size = 16", "max_queue_delay_us = 0", "threads = 1"]
    bf16 = rng.random() < 0.2  # both in bf16: batched and alone then round at other places (a wider tolerance)
    if bf16:
        batched.append('precision = "bf16"')
        reference.append('precision = "bf16"')
    if fixed:
        batched = ["max_batch_size = 0"] + [c for c in batched if c.startswith(("instances", "threads", "precision"))]
        reference = ["max_batch_size = 0"] + [c for c in reference if c.startswith(("threads", "precision"))]
        max_batch = fixed
    elif not dynamic:
        batched.append("dynamic_batch = true")
        reference.append("dynamic_batch = true")
    for name, cfg in ((f"b{seed}", batched), (f"r{seed}", reference)):
        os.makedirs(os.path.join(stage, name, "1"))
        shutil.copy(model, os.path.join(stage, name, "1", "model.onnx"))
        with open(os.path.join(stage, name, "config.toml"), "w") as f:
            f.write("\n".join(cfg) + "\n")
    tol = max(args.tolerance, 3e-2) if bf16 else args.tolerance
    return {"seed": seed, "inputs": ins, "outputs": outs, "max_batch": max_batch, "config": batched, "tol": tol,
            "fixed": fixed, "mixed": mixed}, None


def draw_request(r, rng, plan, rid, bad_kind=None):
    """(body, headers, bad kind or None, description) of one random request."""
    ins = plan["inputs"]
    rows = plan["fixed"] or r.randint(1, 3)
    shapes = [[rows] + [d if d is not None else 1 for d in dims[1:]] for _, _, dims in ins]
    dtypes = [dt for _, dt, _ in ins]
    if bad_kind == "rows":
        rows = plan["max_batch"] + 1
        shapes = [[rows] + s[1:] for s in shapes]
    elif bad_kind == "dim":
        fixed = [(k, j) for k, (_, _, dims) in enumerate(ins) for j in range(1, len(dims)) if dims[j] is not None]
        if not fixed:
            bad_kind = "dtype"
        else:
            k, j = r.choice(fixed)
            shapes[k][j] += 1
    if bad_kind == "dtype":
        k = r.randrange(len(ins))
        dtypes[k] = np.dtype(np.float64) if dtypes[k] != np.float64 else np.dtype(np.float32)
    arrays = [draw(rng, dt, s) for dt, s in zip(dtypes, shapes)]
    outputs = None
    if r.random() < 0.4:
        outputs = r.sample(plan["outputs"], r.randint(1, len(plan["outputs"])))
    binary_in, binary_out = r.random() < 0.5, r.random() < 0.5
    body, headers = make_body(r, ins, arrays, outputs, binary_in, binary_out, rid)
    if bad_kind == "length":
        k = r.randrange(len(ins))
        cut = arrays[:]
        cut[k] = arrays[k].ravel()[:-1].reshape(-1)
        js = json.loads(body[:int(headers["Inference-Header-Content-Length"])] if headers else body)
        if binary_in:
            raw = b"".join(a.tobytes() for a in cut)
            for e, a in zip(js["inputs"], cut):
                e["parameters"]["binary_data_size"] = a.nbytes
            head = json.dumps(js).encode()
            body, headers = head + raw, {"Inference-Header-Content-Length": str(len(head))}
        else:
            js["inputs"][k]["data"] = cut[k].tolist()
            body, headers = json.dumps(js).encode(), {}
    elif bad_kind == "deadline":  # a good request with a queue deadline of 1 us: served, or 504 and never run
        body, headers = rewrite_header(body, headers, lambda js: js.setdefault("parameters", {}).update(timeout=1))
    desc = (f"rows {rows}, {'binary' if binary_in else 'JSON'} in, {'binary' if binary_out else 'JSON'} out, "
            f"outputs {outputs if outputs is not None else 'all'}" + (f", bad: {bad_kind}" if bad_kind else ""))
    return body, headers, bad_kind, desc


def run_case(args, server, stage, repo, plan, r, rng):
    """(status, message, requests) of one case on the running server: loads it, fuzzes it, unloads it."""
    seed = plan["seed"]
    loaded = []
    try:
        for name in (f"r{seed}", f"b{seed}"):
            shutil.copytree(os.path.join(stage, name), os.path.join(repo, name))
            st, _, b = post(server.port, f"/v2/repository/models/{name}/load", b"", {}, args.timeout * 4)
            if st == 400 and (b"a batch of 2 rows" in b or b"mixes the rows of a batch" in b):
                if b"mixes the rows of a batch" in b:
                    if plan["mixed"]:
                        args.mixed_refused += 1
                    else:  # a chain whose rows mix by itself, or a check too strict: look at it (-v lists it)
                        args.unplanned_mixed += 1
                return "unbatchable", f"refused at load: {json.loads(b)['error'][:300]}", []
            if st != 200:
                return "fail", f"loading {name}: {st} {b[:300]!r}", []
            loaded.append(name)
        try:
            return fuzz_loaded(args, server, plan, r, rng)
        except (ValueError, KeyError, TypeError) as e:  # an answer that does not parse as the protocol says
            return "fail", f"a malformed answer: {type(e).__name__}: {e}", []
    finally:
        for name in loaded:
            if server.alive():
                post(server.port, f"/v2/repository/models/{name}/unload", b"", {}, args.timeout)
        for name in (f"r{seed}", f"b{seed}"):
            shutil.rmtree(os.path.join(repo, name), ignore_errors=True)


def fuzz_loaded(args, server, plan, r, rng):
    rpath = f"/v2/models/r{plan['seed']}/infer"
    t = args.timeout
    # The probe: a request of 2 rows to the reference, and each of its rows alone (not for a fixed batch).
    ins = plan["inputs"]
    if plan["fixed"]:
        return fuzz_burst(args, server, plan, r, rng)
    arrays = [draw(rng, dt, [2] + [d if d is not None else 1 for d in dims[1:]]) for _, dt, dims in ins]
    body, hdr = make_body(r, ins, arrays, None, True, True, "probe")
    st, h, b = post(server.port, rpath, body, hdr, t)
    if st != 200:
        return "fail", f"the reference, loaded after its check at 2 rows, refused 2 rows: {st} {b[:300]!r}", []
    _, _, both = parse_answer(st, h, b)
    for row in range(2):
        body, hdr = make_body(r, ins, [a[row:row + 1] for a in arrays], None, True, True, "probe")
        st, h, b = post(server.port, rpath, body, hdr, t)
        if st != 200:
            return "fail", f"the reference refused one row of a 2-row request it ran: {st} {b[:300]!r}", []
        _, _, one = parse_answer(st, h, b)
        for k in one:
            if both[k].ndim == 0 or both[k].shape[0] != 2 or rel_err(both[k][row:row + 1], one[k]) > plan["tol"]:
                return "fail", (f"b{plan['seed']} loaded with batching, but output {k}'s row {row} of 2 differs "
                                f"from the row alone: the server's load check of mixed rows missed it"), []
    return fuzz_burst(args, server, plan, r, rng)


def fuzz_burst(args, server, plan, r, rng):
    """The concurrent burst to the batched model, each good answer then compared with the reference's."""
    seed = plan["seed"]
    bpath, rpath = f"/v2/models/b{seed}/infer", f"/v2/models/r{seed}/infer"
    t = args.timeout
    n = r.randint(16, 32)
    reqs = []
    for i in range(n):
        x = r.random()
        bad = r.choice(["dtype", "dim", "rows", "length"]) if x < 1 / 6 else "abandon" if x < 0.22 else \
            "deadline" if x < 0.27 else None
        reqs.append((f"req-{seed}-{i}",) + draw_request(r, rng, plan, f"req-{seed}-{i}", bad))

    def send(q):
        rid, body, hdr, bad, _ = q
        try:
            if bad == "abandon":  # half the body, then the connection closed
                abandon(server.port, bpath, body, hdr)
                return ("abandoned", {}, b"")
            return post(server.port, bpath, body, hdr, t)
        except Exception as e:  # a timeout, a reset connection
            return ("error", str(e), b"")

    # One case in four loads a version 2 of the batched model (the same file) in the middle of the burst: requests
    # without a version move to it, and none of those accepted by version 1 may be lost.
    reload = r.random() < 0.25

    def reload_now():
        d = os.path.join(args.repo, f"b{seed}", "2")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(args.repo, f"b{seed}", "1", "model.onnx"), os.path.join(d, "model.onnx"))
        return post(server.port, f"/v2/repository/models/b{seed}/load", b"", {}, t * 4)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        futures = [pool.submit(send, q) for q in reqs[:n // 2]]
        reloaded = pool.submit(reload_now) if reload else None
        futures += [pool.submit(send, q) for q in reqs[n // 2:]]
        answers = [f.result() for f in futures]
        if reloaded is not None:
            st, _, b = reloaded.result()
            if st != 200:
                return "fail", f"loading version 2 of b{seed} during the burst: {st} {b[:300]!r}", []
    log = []
    for (rid, body, hdr, bad, desc), (st, h, b) in zip(reqs, answers):
        log.append({"id": rid, "desc": desc, "status": st, "headers": hdr, "body": body.decode("latin-1")})
        if st == "error":
            return "fail", f"{rid} ({desc}): {h}" + ("; the server died" if not server.alive() else ""), log
        if bad == "abandon" or (bad == "deadline" and st == 504):
            continue
        if bad and bad != "deadline":
            if st != 400:
                return "fail", f"{rid} ({desc}): status {st} instead of 400: {b[:300]!r}", log
            continue
        if st != 200:
            return "fail", f"{rid} ({desc}): status {st}: {b[:300]!r}", log
        _, got_id, got = parse_answer(st, h, b)
        if got_id != rid:
            return "fail", f"{rid} ({desc}): id {got_id!r} echoed", log
        if bad == "deadline":
            body, hdr = rewrite_header(body, hdr, lambda js: js["parameters"].pop("timeout"))
        rst, rh, rb = post(server.port, rpath, body, hdr, t)
        if rst != 200:
            return "fail", f"{rid} ({desc}): the reference answered {rst}: {rb[:300]!r}", log
        _, _, want = parse_answer(rst, rh, rb)
        diff = compare(got, want, plan["tol"])
        if diff:
            return "fail", f"{rid} ({desc}): batched and alone differ: {diff}", log
    rows, execs = batch_stats(server.port, f"b{seed}")
    args.rows += rows
    args.execs += execs
    return "pass", f"{n} requests, {rows} rows in {execs} runs", log


def batch_stats(port, model):
    """(inference rows, executions) of a model, from /metrics."""
    st, text = get(port, "/metrics")
    found = {}
    for line in text.decode().splitlines():
        m = re.match(r'keel_inference_(count|exec_count)\{model="([^"]+)",version="\d+"\} (\d+)', line)
        if m and m.group(2) == model:
            found[m.group(1)] = found.get(m.group(1), 0) + int(m.group(3))
    return found.get("count", 0), found.get("exec_count", 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="Keel's build directory (bin/keel, bin/keel-cts)")
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1, help="The first random chain's seed")
    ap.add_argument("--concurrency", type=int, default=8, help="Client threads of a burst")
    ap.add_argument("--timeout", type=float, default=60, help="Seconds a request may take")
    ap.add_argument("--tolerance", type=float, default=1e-3, help="Relative L2 error between batched and alone")
    ap.add_argument("--keep", default="", help="Directory for failing cases (repository, requests, server log)")
    ap.add_argument("--verbose", "-v", action="store_true", help="Print every case")
    args = ap.parse_args()
    keel = os.path.join(args.build, "bin", "keel")
    counts = {"pass": 0, "unbatchable": 0, "skip": 0, "fail": 0}
    with tempfile.TemporaryDirectory(prefix="keel-fuzz-serve-") as work:
        repo, stage = os.path.join(work, "repo"), os.path.join(work, "stage")
        os.makedirs(repo)
        plans = []
        for seed in range(args.seed, args.seed + args.cases):
            plan, why = prepare(args, seed, stage, random.Random(seed))
            if plan is None:
                counts["skip"] += 1
                if args.verbose:
                    print(f"skip seed {seed}: {why}", flush=True)
            else:
                plans.append(plan)
        server = Server(keel, repo, os.path.join(work, "server.log"))
        args.rows = args.execs = args.mixed_refused = args.unplanned_mixed = 0
        args.repo = repo
        try:
            for plan in plans:
                seed = plan["seed"]
                r, rng = random.Random(seed * 7919 + 1), np.random.default_rng(seed)
                if not server.alive():
                    raise ServerDied(f"keel serve exited with {server.p.returncode} before seed {seed}")
                status, msg, log = run_case(args, server, stage, repo, plan, r, rng)
                counts[status] += 1
                if status == "fail" or args.verbose:
                    mixed = f" (output {plan['mixed']}'s rows mixed on purpose)" if plan["mixed"] else ""
                    print(f"{status} seed {seed}{mixed}: {msg} [{', '.join(plan['config'])}]", flush=True)
                if status == "fail" and args.keep:
                    dst = os.path.join(args.keep, f"seed{seed}")
                    shutil.rmtree(dst, ignore_errors=True)
                    os.makedirs(dst)
                    for name in (f"b{seed}", f"r{seed}"):
                        shutil.copytree(os.path.join(stage, name), os.path.join(dst, "repo", name))
                    with open(os.path.join(dst, "requests.json"), "w") as f:
                        json.dump(log, f, indent=1)
                    print(f"    kept in {dst}: keel serve --model-repository {dst}/repo --port 0, then the requests "
                          f"of requests.json", flush=True)
                if status == "fail" and not server.alive():
                    raise ServerDied(f"keel serve exited with {server.p.returncode} during seed {seed}")
        except ServerDied as e:
            print(f"FAIL: {e}", flush=True)
            counts["fail"] += 1
        finally:
            rc = server.stop()
            with open(os.path.join(work, "server.log")) as f:
                log_text = f.read()
            if args.keep and counts["fail"]:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(os.path.join(work, "server.log"), os.path.join(args.keep, "server.log"))
        reports = [x for x in ("AddressSanitizer", "ThreadSanitizer", "runtime error:") if x in log_text]
        if reports:
            print(f"FAIL: the server's log has a sanitizer report ({', '.join(reports)})", flush=True)
            counts["fail"] += 1
        if rc not in (0, None) and not counts["fail"]:
            print(f"FAIL: keel serve exited with {rc} after SIGTERM", flush=True)
            counts["fail"] += 1
    summary = ", ".join(f"{v} {k}" for k, v in counts.items())
    rows, execs = args.rows, args.execs
    avg = f"; batched models ran {rows} rows in {execs} executions"
    if execs:
        avg += f" ({rows / execs:.2f} a batch)"
    mixed = sum(1 for p in plans if p["mixed"])
    avg += (f"; {mixed} with rows mixed on purpose, {args.mixed_refused} of them refused at load for it, "
            f"{args.unplanned_mixed} others refused for mixed rows")
    print(f"fuzz_serve: {args.cases} cases from seed {args.seed}: {summary}{avg}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
