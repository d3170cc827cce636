#!/usr/bin/python3
"""Keel side by side with its peers (ONNX Runtime via Node, PyTorch) on the same models, interleaved.

For each model and each round, every engine runs once as a fresh process (`keel bench --json`,
`node ort_bench.js --json`, `python3 torch_bench.py --json`) in the order keel, ort, torch; the order rotates each
round so that no engine always runs right after another. Reported: each engine's median of the per-run medians,
and Keel's paired speed ratio (peer latency / Keel latency within one round, median over rounds; > 1 means Keel is
faster). With --verify, Keel's output on test_data_set_0 is compared with the PyTorch reference output first.

A cell with fewer threads than the machine has CPUs runs every engine of a round on the same CPUs (round r on
CPUs r*T.. mod the CPU count, so the rounds rotate over them; --no-pin turns this off): on a virtual machine one
vCPU can be much slower than another (measured on the 2-vCPU development host: efficientnet_b0 at 1 thread, Keel
6.4 vs 7.8 ms and ONNX Runtime 7.9 vs 10.0 ms on vCPU 0 vs vCPU 1), and unpinned, each fresh process lands on
either, so a round's ratio measured the placement more than the engines.

The models come from ../shared/peers/make_models.py (setup.sh puts them in /tmp/keel-peers/models).

  tools/compare_peers.py --models simple_cnn,resnet18,transformer_enc --threads 2 --rounds 3 --iters 20
  tools/compare_peers.py --baseline /tmp/old/build/bin/keel --peers '' --threads 1,2   # before/after a change
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_json(cmd, env=None, timeout=600, cpus=None):
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, preexec_fn=pin)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    out = p.stdout.strip()
    start = out.find("{")
    return json.loads(out[start:])


def verify(keel, model_dir, rtol):
    """Keel's output on test_data_set_0 against the stored reference output (max |diff| <= rtol * max |ref|)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    meta = json.load(open(os.path.join(model_dir, "meta.json")))
    data = os.path.join(model_dir, "test_data_set_0")
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([keel, "run", os.path.join(model_dir, "model.onnx"), "--input",
                            f"{meta['input_name']}={data}/input_0.pb", "-o", tmp, "--print", "0"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            return False, p.stderr.strip()[-300:]
        got = numpy_helper.to_array(onnx.load_tensor(os.path.join(tmp, "output_0.pb")))
    ref = numpy_helper.to_array(onnx.load_tensor(os.path.join(data, "output_0.pb")))
    diff = float(np.max(np.abs(got.astype(np.float64) - ref))) if got.shape == ref.shape else float("inf")
    scale = float(np.max(np.abs(ref))) or 1.0
    return diff <= rtol * scale, f"max |diff| {diff:.3g} (max |ref| {scale:.3g})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="simple_cnn,resnet18,transformer_enc")
    ap.add_argument("--models-dir", default=os.path.join(os.environ.get("KEEL_PEERS_ROOT", "/tmp/keel-peers"), "models"))
    ap.add_argument("--peers-dir", default=os.path.join(os.path.dirname(ROOT), "shared", "peers"))
    ap.add_argument("--keel", default=os.path.join(ROOT, "build", "bin", "keel"))
    ap.add_argument("--threads", default="2", help="comma-separated thread counts, e.g. 1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=3.0)
    ap.add_argument("--peers", default="ort,torch", help="which peers: ort, torch (eager), ts (TorchScript); '' for none")
    ap.add_argument("--baseline", metavar="KEEL",
                    help="another keel binary (an older build) run as engine 'base' in the same rounds: before/after")
    ap.add_argument("--verify", action="store_true", help="check Keel's output against the reference first")
    ap.add_argument("--json", help="also write the raw results to this file")
    ap.add_argument("--no-pin", action="store_true",
                    help="let the scheduler place each engine (default: a round's engines share its CPUs)")
    a = ap.parse_args()

    openblas = os.path.join(os.path.dirname(a.models_dir), "openblas/usr/lib/x86_64-linux-gnu/openblas-openmp")
    torch_env = dict(os.environ)
    if os.path.isdir(openblas):
        torch_env["LD_LIBRARY_PATH"] = openblas + (":" + torch_env["LD_LIBRARY_PATH"] if torch_env.get("LD_LIBRARY_PATH") else "")

    def cmd(engine, model_dir, threads):
        common = ["--iters", str(a.iters), "--warmup", str(a.warmup), "--max-seconds", str(a.max_seconds), "--json"]
        if engine in ("keel", "base"):
            return [a.keel if engine == "keel" else a.baseline, "--threads", threads, "bench", os.path.join(model_dir, "model.onnx")] + common, None
        if engine == "ort":
            return ["node", os.path.join(a.peers_dir, "ort_bench.js"), model_dir, "--threads", threads] + common, None
        mode = "ts" if engine == "ts" else "eager"
        return (["/usr/bin/python3", os.path.join(a.peers_dir, "torch_bench.py"), model_dir, "--threads", threads,
                 "--mode", mode] + common, torch_env)

    engines = ["keel"] + (["base"] if a.baseline else []) + [p for p in a.peers.split(",") if p]
    raw = []
    rows = []
    for model in a.models.split(","):
        model_dir = os.path.join(a.models_dir, model)
        if a.verify:
            ok, msg = verify(a.keel, model_dir, 1e-3)
            print(f"verify {model}: {'ok' if ok else 'FAILED'} {msg}", flush=True)
        for threads in a.threads.split(","):
            med = {e: [] for e in engines}
            paired = {e: [] for e in engines if e != "keel"}
            allowed = sorted(os.sched_getaffinity(0))
            t = int(threads)
            for r in range(a.rounds):
                order = engines[r % len(engines):] + engines[:r % len(engines)]
                cpus = None
                if not a.no_pin and t < len(allowed):
                    cpus = {allowed[(r * t + k) % len(allowed)] for k in range(t)}
                got = {}
                for e in order:
                    c, env = cmd(e, model_dir, threads)
                    try:
                        j = run_json(c, env, cpus=cpus)
                    except Exception as ex:  # a peer that cannot run this model is reported, not fatal
                        print(f"  {model} t={threads} {e}: {ex}", file=sys.stderr)
                        continue
                    got[e] = j["median_ms"]
                    med[e].append(j["median_ms"])
                    raw.append({"model": model, "threads": threads, "round": r, "engine": e, "result": j})
                for e in paired:
                    if "keel" in got and e in got:
                        paired[e].append(got[e] / got["keel"])
                where = f" (cpu {','.join(map(str, sorted(cpus)))})" if cpus else ""
                print(f"  {model} t={threads} round {r}{where}: " +
                      ", ".join(f"{e} {got[e]:.3f} ms" for e in order if e in got), flush=True)
            row = {"model": model, "threads": threads}
            for e in engines:
                row[e] = statistics.median(med[e]) if med[e] else None
            for e in paired:
                row["ratio_" + e] = statistics.median(paired[e]) if paired[e] else None
            rows.append(row)

    hdr = ["model", "threads"] + [f"{e} ms" for e in engines] + [f"{e}/keel" for e in engines if e != "keel"]
    print("\n| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for row in rows:
        cells = [row["model"], row["threads"]]
        cells += ["-" if row[e] is None else f"{row[e]:.3f}" for e in engines]
        cells += ["-" if row["ratio_" + e] is None else f"{row['ratio_' + e]:.2f}x" for e in engines if e != "keel"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print("\n(e/keel = the peer's latency over Keel's within each round, median over rounds; > 1: Keel is faster)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "raw": raw}, f, indent=1)


if __name__ == "__main__":
    main()
