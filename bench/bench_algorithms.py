#!/usr/bin/env python3
"""The algorithm menu learns: each example config's learning metric at the
start of its last stage and at its end, the gain, and the wall time.

Usage: bench/bench_algorithms.py TROUPE_BINARY [--only NAME ...] [--set KEY=VALUE ...]
       bench/bench_algorithms.py TROUPE_BINARY --record-bands tests/data/learning_bands.json

Runs, one after another on this machine, the example jobs of docs/rlhf.md's
algorithm table — configs/{quickstart,grpo,dapo,gspo,remax,dpo}.yaml — each
in a fresh temporary run directory, and prints per job: the metric (the RL
stage's held-out val/score/mean, the mean rule score of sampled responses;
for DPO the held-out pairwise val/rewards/accuracies, which is 0 at step 0,
where the policy equals its reference), its value at the stage's step 0 and
at its last step, the gain, whether the gain meets the issue's floor
(+0.15), and the job's wall time. docs/benchmarks.md records a run.

--record-bands runs the shortened version of each job that the bands file
names (its "sets": fewer iterations, a smaller held-out split) and writes
each of its curves' metric at each evaluated step into the file ("steps"): the
learning-curve gate (tests/apps/learning_curves_integration_test.cpp) runs
the same shortened jobs in CI and fails when a value leaves its band
(recorded ± "tolerance") or a curve's gain falls below its "min_gain".
--only limits the recording to the jobs named.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "configs")
FLOOR = 0.15
# name: (stage, metric)
JOBS = {
    "quickstart": ("rl", "val/score/mean"),
    "grpo": ("rl", "val/score/mean"),
    "dapo": ("rl", "val/score/mean"),
    "gspo": ("rl", "val/score/mean"),
    "remax": ("rl", "val/score/mean"),
    "dpo": ("dpo", "val/rewards/accuracies"),
}


def learning(metrics_path, stage, metric):
    """(value at the stage's step 0, value at its last step) of `metric`."""
    first = last = None
    for line in open(metrics_path):
        j = json.loads(line)
        if j.get("stage") != stage or metric not in j:
            continue
        if first is None:
            first = (j["step"], j[metric])
        last = (j["step"], j[metric])
    if first is None:
        raise SystemExit(f"{metrics_path}: no {stage} line with {metric}")
    # The RL stage evaluates before its first iteration (step 0); the DPO
    # stage's policy equals its reference at step 0, where no pair is ordered.
    start = first[1] if first[0] == 0 else 0.0
    return start, last[1]


def run_job(binary, name, run_dir, sets):
    cmd = [binary, "run", os.path.join(CONFIGS, name + ".yaml"), "--set", f"run.dir={run_dir}",
           "--set", "run.progress=none"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr}")
    return time.monotonic() - t0


def curve(metrics_path, stage, metric):
    """{step: value} of `metric` in `stage`."""
    out = {}
    for line in open(metrics_path):
        j = json.loads(line)
        if j.get("stage") == stage and metric in j:
            out[str(j["step"])] = round(j[metric], 4)
    return out


def record_bands(binary, path, only):
    bands = json.load(open(path))
    with tempfile.TemporaryDirectory() as work:
        for name, job in bands["jobs"].items():
            if only and name not in only:
                continue
            run_dir = os.path.join(work, name)
            wall = run_job(binary, name, run_dir, job["sets"])
            for metric, band in job["curves"].items():
                band["steps"] = curve(os.path.join(run_dir, "metrics.jsonl"), job["stage"], metric)
                print(f"{name}: {metric} {band['steps']} ({wall:.1f}s)", flush=True)
    with open(path, "w") as f:
        json.dump(bands, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--set", nargs="*", default=[], dest="sets")
    ap.add_argument("--record-bands", metavar="FILE")
    args = ap.parse_args()
    if args.record_bands:
        record_bands(args.binary, args.record_bands, args.only)
        return 0
    print(f"{'job':<11} {'metric':<24} {'start':>6} {'end':>6} {'gain':>6} {'floor':>6} {'wall':>7}")
    failed = False
    with tempfile.TemporaryDirectory() as work:
        for name in args.only or list(JOBS):
            stage, metric = JOBS[name]
            run_dir = os.path.join(work, name)
            wall = run_job(args.binary, name, run_dir, args.sets)
            start, end = learning(os.path.join(run_dir, "metrics.jsonl"), stage, metric)
            gain = end - start
            ok = "met" if gain >= FLOOR else "NOT met"
            failed |= gain < FLOOR
            print(f"{name:<11} {metric:<24} {start:6.3f} {end:6.3f} {gain:+6.3f} {ok:>6} {wall:6.1f}s",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
