#!/usr/bin/env python3
"""The cost of rl.true_on_policy on step time, against the same job without it.

Usage: bench/bench_true_on_policy.py TROUPE_BINARY [--iterations K] [--rounds N]

Runs the quickstart (configs/quickstart.yaml: its model, task and PPO
settings, SFT cut to a few steps, no reward-model stage: the critic starts
from SFT) three ways, interleaved round by round on this shared machine:
  baseline        true_on_policy off, the policy's old log-probs
  exact/policy    true_on_policy on, the policy's old log-probs
  exact/engine    true_on_policy on, the engine's (configs/true_on_policy.yaml)
and prints, per way, the median over rounds of the median timing_s/step of
iterations 2..K (and of the phases that change: gen, old_log_prob,
update_actor), with the ratio to the baseline.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
QUICKSTART = os.path.join(HERE, "..", "configs", "quickstart.yaml")
PHASES = ["timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor"]
WAYS = {
    "baseline": [],
    "exact/policy": ["rl.true_on_policy=true"],
    "exact/engine": ["rl.true_on_policy=true", "rl.old_logprobs=engine"],
}


def run_once(binary, sets, iterations, workdir):
    run_dir = tempfile.mkdtemp(dir=workdir)
    common = ["stages=[sft, rl]", "sft.steps=10", "sft.eval_every=0", "rl.critic.init=sft",
              f"rl.iterations={iterations}", "rl.eval_every=0", "rl.checkpoint_every=0",
              "data.eval_size=8", "rl.eval_samples=1", f"run.dir={run_dir}", "run.progress=none"]
    args = [binary, "run", QUICKSTART]
    for s in common + sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [l for l in lines if l.get("stage") == "rl" and "timing_s/step" in l][1:]
    for line in steps:
        if "true_on_policy=true" in " ".join(sets):
            assert line["rollout_corr/logprob_abs_diff_max"] == 0.0, line
    return {p: statistics.median(l.get(p, 0.0) for l in steps) for p in PHASES}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.iterations < 3 or a.rounds < 1:
        sys.exit("--iterations must be >= 3 and --rounds >= 1")
    results = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            for way, sets in WAYS.items():
                results[way].append(run_once(a.binary, sets, a.iterations, work))
                print(f"round {r + 1} {way}: step {results[way][-1]['timing_s/step']:.3f} s",
                      flush=True)
    med = {w: {p: statistics.median(x[p] for x in v) for p in PHASES} for w, v in results.items()}
    base = med["baseline"]["timing_s/step"]
    print(f"\n{'way':<14}" + "".join(f"{p.split('/')[1]:>14}" for p in PHASES) + f"{'step ratio':>12}")
    for way, m in med.items():
        print(f"{way:<14}" + "".join(f"{m[p]:>14.3f}" for p in PHASES) +
              f"{m['timing_s/step'] / base:>11.2f}x")


if __name__ == "__main__":
    main()
