#!/usr/bin/env python3
"""Two revisions of bench_job in one run: before / after, interleaved.

Usage: bench/bench_job_ab.py BEFORE_BENCH_JOB AFTER_BENCH_JOB [--rounds N] [--iterations K]

The machines here are shared and noisy, so the two binaries run alternately
(before, after, before, after, ...) and each figure is the median over the
rounds; the ratios after / before are printed. Build the older revision in a
worktree of its own (docs/benchmarks.md says how) and pass its bench_job.

Read from each run: the actor round trip p50, the PPO step median and the
orchestration share median with no job command pending, and where the
revision has it (issue 16 on), the step median of the same job without its
TensorBoard files: the before revision had no exporters, so that is the
like-for-like step. bench_job's output changed when the job actor came
(issue 13); both forms are read.
"""

import argparse
import re
import statistics
import subprocess
import sys

PATTERNS = {
    "round trip p50 (us)": [r"actor round trip:\s+p50 ([0-9.]+) us"],
    "PPO step median (s)": [
        r"PPO step, no command pending:\s+step median ([0-9.]+) s",
        r"PPO step \(quickstart shape, 128 responses\): median ([0-9.]+) s",
    ],
    "orchestration share median (%)": [
        r"PPO step, no command pending:.*orchestration share median ([0-9.]+)%",
        r"orchestration share: median ([0-9.]+)%",
    ],
    "PPO step, no exporters (s)": [
        r"PPO step with TensorBoard files: median [0-9.]+ s; without: ([0-9.]+) s",
        r"PPO step \(quickstart shape, 128 responses\): median ([0-9.]+) s",
    ],
}


def measure(binary, iterations):
    out = subprocess.run([binary, str(iterations)], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"{binary} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    got = {}
    for name, patterns in PATTERNS.items():
        for p in patterns:
            m = re.search(p, out.stdout)
            if m:
                got[name] = float(m.group(1))
                break
        else:
            sys.exit(f"{binary}: no '{name}' in its output:\n{out.stdout}")
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=12)
    a = ap.parse_args()
    runs = {"before": [], "after": []}
    for r in range(a.rounds):
        for side, binary in (("before", a.before), ("after", a.after)):
            m = measure(binary, a.iterations)
            runs[side].append(m)
            print(f"round {r + 1} {side:6}: " + ", ".join(f"{k} {v:g}" for k, v in m.items()), flush=True)
    print(f"\nmedians over {a.rounds} interleaved rounds ({a.iterations} iterations per job):")
    print(f"{'measurement':34} {'before':>10} {'after':>10} {'after/before':>13}")
    for name in PATTERNS:
        b = statistics.median(m[name] for m in runs["before"])
        f = statistics.median(m[name] for m in runs["after"])
        print(f"{name:34} {b:10.3f} {f:10.3f} {f / b if b else float('nan'):12.3f}x")


if __name__ == "__main__":
    main()
