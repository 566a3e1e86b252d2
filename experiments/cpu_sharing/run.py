"""CPU sharing: how much slower a training step gets next to other work, per OpenMP wait setting.

Question (issue #24): next to one other 2-thread torch process a training step of the default
audio captioner ran ~10x slower, not the fair ~2x. Which setting of how OpenMP threads wait
(libgomp's default spin, ``OMP_WAIT_POLICY=PASSIVE``, ``GOMP_SPINCOUNT=N``, mmtf's run-time spin
governor, the default) gives
about the fair share next to other work and loses little alone?

Per setting and condition a fresh measuring process builds the default experiment's model and
AdamW exactly as ``experiments/training_throughput`` does, starts mmtf's CPU sharing as
``mmtf.train`` does (``share_cpu(cfg.cpu_sharing)`` of the composed config, after the model is
built), and times ``--steps`` training steps on batches of the experiment's batch size (4 s
clips). Settings: ``mmtf`` = the config's default (the spin governor of
``mmtf/utils/cpu_sharing.py``); ``off`` = ``cpu_sharing.wait=off`` (libgomp's default spin);
``passive`` = ``OMP_WAIT_POLICY=PASSIVE`` and ``spin<N>`` = ``GOMP_SPINCOUNT=N`` in the
environment before torch loads (the user's setting: no governor). Conditions: idle; started beside one and two competing
2-thread torch processes (a matmul loop with libgomp's default spin: other people's work, not
mmtf's); started beside a competing mmtf process (the same step in a loop under the same
setting, started first on the idle machine: a second experiment on one workstation); and one
torch process that starts *after* the measuring process (work that arrives during a run: a
choice made at start cannot see it). Conditions run in the same order for every setting, and
the idle condition is measured first and again last (its spread is the noise).

    python experiments/cpu_sharing/run.py                  # the default settings (~10 min on 2 cores)
    python experiments/cpu_sharing/run.py --steps 10 --settings off mmtf
    python experiments/cpu_sharing/run.py --settings off mmtf --repeats 3 \
        --conditions idle "1 torch" "1 torch later" "idle again"

Prints the cores, CPU flags and load average, a table of seconds and ratios to the same
setting's idle time, and, last, one JSON line. Needs an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WAIT_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MMTF_CPU_SHARING", "OMP_NUM_THREADS")
CONDITIONS = ("idle", "1 torch", "2 torch", "1 mmtf", "1 torch later", "idle again")


def setting_env(name: str) -> tuple[dict[str, str], list[str]]:
    """The environment of one setting (the user's wait keys removed, this setting's added) and
    the config overrides of its measuring process."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_KEYS}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    overrides = []
    if name == "off":
        overrides = ["cpu_sharing.wait=off"]          # libgomp's default: 300,000 spins
    elif name == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif name.startswith("spin"):
        env["GOMP_SPINCOUNT"] = name.removeprefix("spin")
    elif name != "mmtf":                              # mmtf: the config's default
        raise SystemExit(f"unknown setting {name!r}: off, mmtf, passive or spin<N>")
    return env, overrides


# ---------------------------------------------------------------------------- the workload
def worker(steps: int, loop: bool, overrides: list[str]) -> None:
    """Build the model, start CPU sharing as ``mmtf.train`` does, then time ``steps`` steps per
    line read from stdin (or loop forever)."""
    import importlib.util

    import torch

    from mmtf.utils.cpu_sharing import share_cpu

    spec = importlib.util.spec_from_file_location(
        "training_throughput", REPO / "experiments" / "training_throughput" / "run.py")
    tt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tt)
    device = torch.device("cpu")
    model, opt, cfg = tt.build_mmtf(overrides, device)
    ready = share_cpu(cfg.cpu_sharing)                # one process, no loader workers
    batches = tt.make_batches(cfg, 4, int(cfg.data.batches.batch_size), 4.0, device)

    def run(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            tt.mmtf_step(model, opt, batches[i % len(batches)], dtype=torch.float32)
        return time.perf_counter() - start

    run(2)                                            # warm-up: allocator, oneDNN primitives
    if loop:
        while True:
            run(1)
    print(json.dumps({"ready": ready, "batch": int(cfg.data.batches.batch_size)}),
          flush=True)
    for _ in sys.stdin:
        print(json.dumps({"seconds": run(steps)}), flush=True)


def torch_competitor() -> None:
    """Other people's work: a 2-thread torch matmul loop under libgomp's default spin."""
    import torch

    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    while True:
        for _ in range(50):
            b = a @ a
        torch.relu(b)


# ---------------------------------------------------------------------------- the parent
def start(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__)), *args], env=env, text=True,
                            **kw)


def _worker(env: dict[str, str], overrides: list[str], steps: int,
            ) -> tuple[subprocess.Popen, str]:
    proc = start(["--worker", "--steps", str(steps), "--overrides", *overrides], env,
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return proc, json.loads(proc.stdout.readline())["ready"]


def _go(proc: subprocess.Popen) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    seconds = json.loads(proc.stdout.readline())["seconds"]
    proc.stdin.close()
    proc.wait()
    return seconds


def measure(setting: str, steps: int, conditions: tuple[str, ...] = CONDITIONS,
            ) -> tuple[dict[str, float], dict[str, str]]:
    """Seconds per condition, and how the measuring process's threads waited in each."""
    env, overrides = setting_env(setting)
    plain = {k: v for k, v in os.environ.items() if k not in WAIT_KEYS}
    out: dict[str, float] = {}
    waits: dict[str, str] = {}
    for condition in conditions:
        others: list[subprocess.Popen] = []
        if condition in ("1 torch", "2 torch"):
            others = [start(["--compete"], plain, stdout=subprocess.DEVNULL)
                      for _ in range(int(condition[0]))]
        elif condition == "1 mmtf":
            others = [start(["--worker", "--loop", "--overrides", *overrides], env,
                            stdout=subprocess.DEVNULL)]
        if others:
            time.sleep(20 if condition == "1 mmtf" else 3)   # past their start-up
        proc, ready = _worker(env, overrides, steps)
        if condition == "1 torch later":
            others = [start(["--compete"], plain, stdout=subprocess.DEVNULL)]
            time.sleep(3)
        out[condition] = _go(proc)
        waits[condition] = ready.split("OpenMP waits: ", 1)[-1]
        for other in others:
            other.kill()
            other.wait()
        print(f"[{setting}] {condition}: {out[condition]:.2f} s; {waits[condition]}",
              file=sys.stderr, flush=True)
    return out, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--settings", nargs="+",
                        default=["off", "mmtf", "passive", "spin10000"])
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS),
                        choices=CONDITIONS)
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over every setting and condition; cells report the median "
                             "(and the range)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compete", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--overrides", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.loop, args.overrides)
    if args.compete:
        return torch_competitor()

    sys.path.insert(0, str(REPO))
    from mmtf.perf.device import describe_cpu
    from mmtf.perf.results import append_result
    from mmtf.utils.cpu_sharing import usable_cores

    load = os.getloadavg()
    print(f"cores {usable_cores()}; {describe_cpu()}; load average {load[0]:.2f} "
          f"(before); {args.steps} steps per cell")
    conditions = tuple(c for c in CONDITIONS if c in args.conditions)
    # Rounds interleave the settings, so a drift of the machine reaches every setting alike.
    rounds = [{s: measure(s, args.steps, conditions) for s in args.settings}
              for _ in range(args.repeats)]
    runs = {s: {c: [r[s][0][c] for r in rounds] for c in conditions} for s in args.settings}
    results = {s: {c: float(np.median(v)) for c, v in row.items()} for s, row in runs.items()}

    width = max(len(s) for s in results)
    base = "idle" if "idle" in conditions else conditions[0]
    print(f"\n{'setting':<{width}}  " + "  ".join(f"{c:>16}" for c in conditions)
          + (f"  (medians of {args.repeats} rounds)" if args.repeats > 1 else ""))
    for setting, row in results.items():
        idle = row[base]
        cells = [f"{row[c]:6.2f} s ({row[c] / idle:4.2f}x)" for c in conditions]
        print(f"{setting:<{width}}  " + "  ".join(f"{c:>16}" for c in cells))
    if args.repeats > 1:
        print("\nrange per cell (min-max seconds):")
        for setting, row in runs.items():
            print(f"{setting:<{width}}  " + "  ".join(
                f"{min(v):6.2f}-{max(v):<6.2f}".rjust(16) for v in row.values()))
    summary: dict[str, object] = {"cores": usable_cores(), "cpu": describe_cpu(),
                                  "load_before": round(load[0], 2), "steps": args.steps,
                                  "seconds": results, "repeats": args.repeats,
                                  "all_seconds": runs if args.repeats > 1 else None}
    if "off" in results and "mmtf" in results and {"idle", "1 torch"} <= set(conditions):
        off, ours = results["off"], results["mmtf"]
        idle = [c for c in ("idle", "idle again") if c in conditions]
        summary["mmtf_idle_vs_libgomp_idle"] = round(
            min(ours[c] for c in idle) / min(off[c] for c in idle), 3)
        summary["mmtf_beside_1_torch_vs_idle"] = round(ours["1 torch"] / ours["idle"], 3)
        summary["libgomp_beside_1_torch_vs_idle"] = round(off["1 torch"] / off["idle"], 3)
        if "1 torch later" in conditions:
            summary["mmtf_beside_1_torch_later_vs_idle"] = round(
                ours["1 torch later"] / ours["idle"], 3)
    print(json.dumps(summary))
    append_result(__file__, summary)


if __name__ == "__main__":
    main()
