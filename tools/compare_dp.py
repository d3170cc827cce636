#!/usr/bin/python3
"""Data-parallel scaling of `keel train` against what the host allows, interleaved in one run.

Issue 25 asks for 2 ranks x 1 thread >= 1.8x the throughput of 1 process x 1 thread, "since two independent
processes side by side keep ~2x": on a virtual machine that premise moves from minute to minute (one vCPU can run
20-40% slower than the other, and which one changes), so the ratio means something only beside the host's own
ceiling measured in the same minutes. Each round runs, one after another (the order rotating between rounds):

  alone      1 process x 1 thread on each CPU in turn (pinned): the single-process throughput, per CPU
  together   the same process on every CPU at once (pinned), independent: what the host gives N processes
  ranks      `keel train --nproc N` (the launcher pins rank k to CPU k): data parallelism
  ddp        (--peer-ddp) PyTorch DDP on Gloo, ../shared/peers/train_torch_ddp.py --nproc N --threads 1

and prints per round the last epoch's images per second of each; ranks / alone (the issue's ratio, against the mean
of the CPUs alone); together / alone (the host's ceiling for independent processes); lockstep / alone, N times the
slowest CPU's throughput in `together` (synchronous data parallelism waits for the slowest rank at every step, so this
bounds it on a host whose CPUs differ); ranks / together (what data parallelism keeps of the ceiling: communication
and waiting); and the ranks' work per step. Then the medians over rounds, and over the even ones (the CPUs alone and
together within --even-within of each other, and each CPU together within it of its alone: on a virtual machine whose
CPUs change speed, the rounds that measure the code rather than the host).

  tools/compare_dp.py --model simple --rounds 4
  tools/compare_dp.py --model lenet --rounds 2 --epochs 1 --peer-ddp
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EPOCH = re.compile(r"epoch (\d+)/(\d+): ([0-9.]+) s, ([0-9]+) img/s")
WORK = re.compile(r"work per step ([0-9.]+) ms \(rank \d+\) to ([0-9.]+) ms")


def train_cmd(a, extra=()):
    return [a.keel, "--threads", "1", "train", "--model", a.model, "--epochs", str(a.epochs), "-o", "", "--no-quantize", "-q",
            "--batch", str(a.batch), *extra]


def img_per_s(out, what):
    """The last epoch's images per second."""
    m = [e for e in EPOCH.finditer(out) if e.group(1) == e.group(2)]
    if not m:
        raise RuntimeError(f"{what}: no last-epoch line in its output:\n{out[-800:]}")
    return float(m[-1].group(4))


def run(cmd, cpus=None):
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus is not None else None
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=pin)


def finish(p, what, timeout=1800):
    out, _ = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed ({p.returncode}):\n{out[-800:]}")
    return out


def alone(a, cpus):
    return [img_per_s(finish(run(train_cmd(a), [c]), f"alone on CPU {c}"), f"alone on CPU {c}") for c in cpus]


def together(a, cpus):
    procs = [(c, run(train_cmd(a), [c])) for c in cpus]
    return [img_per_s(finish(p, f"together on CPU {c}"), f"together on CPU {c}") for c, p in procs]


def ranks(a, n):
    out = finish(run(train_cmd(a, ["--nproc", str(n)])), f"{n} ranks")
    w = WORK.search(out)
    return img_per_s(out, f"{n} ranks"), (float(w.group(1)), float(w.group(2))) if w else None


def ddp(a, n):
    script = os.path.join(a.peers_dir, "train_torch_ddp.py")
    out = finish(run(["/usr/bin/python3", script, "--nproc", str(n), "--threads", "1", "--model", a.model,
                      "--epochs", str(a.epochs), "--batch", str(a.batch)]), "PyTorch DDP")
    line = next((l for l in out.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"PyTorch DDP printed no RESULT line:\n{out[-800:]}")
    res = json.loads(line[len("RESULT "):])
    return float(res["epochs"][-1]["wall_s"]), float(res["epochs"][-1]["img_per_s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keel", default=os.path.join(ROOT, "build", "bin", "keel"))
    ap.add_argument("--peers-dir", default=os.path.join(os.path.dirname(ROOT), "shared", "peers"))
    ap.add_argument("--model", default="simple", choices=["simple", "lenet"])
    ap.add_argument("--batch", type=int, default=64, help="per-rank batch (the issue's 64)")
    ap.add_argument("--epochs", type=int, default=2,
                    help="epochs per run; the last one is measured (the first carries each run's start: kernels "
                         "created, and on ranks the first steps' skew, ~20 ms of a 0.45 s SimpleCNN epoch)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=0, help="ranks (default: this process' CPUs)")
    ap.add_argument("--peer-ddp", action="store_true", help="also PyTorch DDP on Gloo in every round")
    ap.add_argument("--even-within", type=float, default=0.10,
                    help="a round is even when its CPUs' throughputs alone, and together, are within this fraction of "
                         "each other and each CPU's together within it of its alone (default 0.10); the summary adds "
                         "the median over even rounds")
    ap.add_argument("--json", help="write every round's numbers here")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    n = a.nproc or len(cpus)
    if n > len(cpus):
        sys.exit(f"compare_dp: --nproc {n} but this process may use {len(cpus)} CPU(s)")
    cpus = cpus[:n]
    kinds = ["alone", "together", "ranks"] + (["ddp"] if a.peer_ddp else [])
    rows = []
    print(f"{a.model}, batch {a.batch} per process, {n} CPUs {cpus}; img/s of epoch {a.epochs} of {a.epochs}", flush=True)
    for r in range(a.rounds):
        row = {"round": r}
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        for k in order:
            if k == "alone":
                row["alone"] = alone(a, cpus)
            elif k == "together":
                row["together"] = together(a, cpus)
            elif k == "ranks":
                row["ranks"], row["work_ms"] = ranks(a, n)
            else:
                row["ddp_epoch_s"], row["ddp"] = ddp(a, n)
        mean_alone = statistics.mean(row["alone"])
        row["ranks_over_alone"] = row["ranks"] / mean_alone
        row["together_over_alone"] = sum(row["together"]) / mean_alone
        row["ranks_over_together"] = row["ranks"] / sum(row["together"])
        row["lockstep_over_alone"] = n * min(row["together"]) / mean_alone
        spread = lambda v: max(v) / min(v) - 1
        row["even"] = (spread(row["alone"]) <= a.even_within and spread(row["together"]) <= a.even_within and
                       all(t >= (1 - a.even_within) * s for t, s in zip(row["together"], row["alone"])))
        rows.append(row)
        work = f", work per step {row['work_ms'][0]:.2f}-{row['work_ms'][1]:.2f} ms" if row.get("work_ms") else ""
        uneven = "" if row["even"] else f" (uneven: CPUs, or a CPU alone and together, differ by over {a.even_within:.0%})"
        peer = (f"; PyTorch DDP {row['ddp']:.0f} img/s (epoch {row['ddp_epoch_s']:.2f} s, Keel's ranks "
                f"{row['ranks'] / row['ddp']:.2f}x its throughput)" if row.get("ddp") else "")
        print(f"round {r}: alone {' / '.join(f'{v:.0f}' for v in row['alone'])} (CPU {' / '.join(map(str, cpus))}), "
              f"together {' + '.join(f'{v:.0f}' for v in row['together'])}, {n} ranks {row['ranks']:.0f}; "
              f"ranks/alone {row['ranks_over_alone']:.2f}x, together/alone {row['together_over_alone']:.2f}x, "
              f"lockstep/alone {row['lockstep_over_alone']:.2f}x, "
              f"ranks/together {row['ranks_over_together']:.2f}{work}{peer}{uneven}", flush=True)

    def summary(label, rs):
        med = lambda k: statistics.median(r[k] for r in rs)
        print(f"median over {label}: {n} ranks / 1 process {med('ranks_over_alone'):.2f}x; "
              f"{n} independent processes / 1 process {med('together_over_alone'):.2f}x (the host's ceiling; "
              f"{med('lockstep_over_alone'):.2f}x at the slowest CPU's pace); "
              f"ranks keep {med('ranks_over_together'):.2f} of it")

    summary(f"{len(rows)} round(s)", rows)
    even = [r for r in rows if r["even"]]
    if even and len(even) < len(rows):
        summary(f"the {len(even)} even round(s)", even)
    elif not even:
        print(f"no even round (every one had CPUs, or a CPU alone and together, over {a.even_within:.0%} apart): "
              "the host's speed moved during the measurement; try again later")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
