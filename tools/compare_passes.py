#!/usr/bin/python3
"""Fusion targets side by side: `keel bench` of a model with passes off against the same model after the default
`keel optimize` pipeline, and a model exported without constant folding (tools/export_unfolded.py) after the pipeline
against the folded export, interleaved in fresh processes per round (the device's own claims stay on in all runs).

For each model it writes OPT/<model>.opt.onnx and OPT/<model>.unfolded.opt.onnx with `keel optimize` (default
pipeline), then per round runs, in rotating order:
  none       the folded export, --passes none
  optimized  the folded export after the pipeline
  unfolded   the unfolded export, --passes none (what a user gets without the pipeline)
  unf+opt    the unfolded export after the pipeline
and prints the median latency of each and the median of the per-round ratios against `none` (of the runs' medians,
and of their minima). With fewer threads than the machine has CPUs, a round's runs share its CPUs, the rounds
rotating over them (--no-pin turns this off).

Models without an unfolded export (e.g. transformer_gelu from tools/make_extra_models.py) run `none` and `optimized`.

usage: tools/compare_passes.py [--keel build/bin/keel] [--models transformer_enc,resnet18] [--threads 1]
                               [--rounds 7] [--iters 20] [--no-pin]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd, cpus=None):
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def last_json(out):
    """The last JSON object of a command's output (`keel bench --json` prints it pretty, from a line '{')."""
    lines = out.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    raise RuntimeError("no JSON in output:\n" + out[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", default="build/bin/keel")
    ap.add_argument("--models-dir", default="/tmp/keel-peers/models")
    ap.add_argument("--unfolded-dir", default="/tmp/keel-peers/models-unfolded",
                    help="made by tools/export_unfolded.py")
    ap.add_argument("--models", default="transformer_enc,resnet18")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--work", default=None)
    ap.add_argument("--no-pin", action="store_true",
                    help="let the scheduler place each run (default: a round's runs share its CPUs)")
    a = ap.parse_args()
    keel = os.path.abspath(a.keel)
    work = a.work or tempfile.mkdtemp(prefix="keel-passes-")
    os.makedirs(work, exist_ok=True)
    out = []
    for m in a.models.split(","):
        folded = os.path.join(a.models_dir, m, "model.onnx")
        unfolded = os.path.join(a.unfolded_dir, m, "model.onnx")
        files = {"none": folded, "optimized": os.path.join(work, m + ".opt.onnx")}
        jobs = [(folded, files["optimized"])]
        if os.path.isfile(unfolded):
            files.update({"unfolded": unfolded, "unf+opt": os.path.join(work, m + ".unfolded.opt.onnx")})
            jobs.append((unfolded, files["unf+opt"]))
        else:
            print(f"== {m}: no unfolded export at {unfolded} (tools/export_unfolded.py makes it): folded only", flush=True)
        for src, dst in jobs:
            rep = run([keel, "optimize", src, "-o", dst])
            print(f"== keel optimize {src}\n   " + "\n   ".join(rep.strip().splitlines()[-3:-1]), flush=True)
        times = {k: [] for k in files}
        mins = {k: [] for k in files}
        names = list(files)
        allowed = sorted(os.sched_getaffinity(0))
        nt = int(a.threads)
        pinned = not a.no_pin and 0 < nt < len(allowed)
        for r in range(a.rounds):
            # A round's runs share its CPUs, the rounds rotating over them: one vCPU of a virtual machine can be
            # much slower than another, and unpinned, each fresh process lands on either.
            cpus = {allowed[(r * nt + c) % len(allowed)] for c in range(nt)} if pinned else None
            for k in names[r % len(names):] + names[:r % len(names)]:
                j = last_json(run([keel, "--threads", a.threads, "bench", files[k], "--passes", "none", "--warmup", "3",
                                   "-n", str(a.iters), "--json"], cpus))
                times[k].append(float(j["median_ms"]))
                mins[k].append(float(j["min_ms"]))
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = {k: statistics.median([n / t for n, t in zip(times["none"], times[k])]) for k in files}
        ratio_min = {k: statistics.median([n / t for n, t in zip(mins["none"], mins[k])]) for k in files}
        print(f"   {m}, {a.threads} thread(s), {a.rounds} rounds{' (pinned)' if pinned else ''}: " +
              "  ".join(f"{k} {med[k]:.2f} ms ({ratio[k]:.2f}x; minima {ratio_min[k]:.2f}x)" for k in files),
              flush=True)
        out.append({"model": m, "median_ms": med, "speedup_vs_none": ratio, "speedup_vs_none_minima": ratio_min})
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
