#!/usr/bin/python3
"""How fast a job's dashboard page loads when the job is long (issue 16's
floor: 10,000 steps of 20 series in under a second in headless Chromium).

Starts `troupe controller` on ephemeral loopback ports, runs a real job of
--steps RL iterations on the tiny model (every iteration reports some 50
metrics), then opens the job's page in Debian's headless Chromium (selenium +
chromium-driver) --loads times and reports the time from navigation start to
the page being ready (every chart drawn: the app sets window.troupeReadyMs),
next to the same page of a 10-step job measured in the same run.

  bench/bench_dashboard.py --troupe build/apps/troupe [--steps 10000] [--loads 7]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

SPEC = """run: {{name: {name}, dir: run, seed: 5, threads: 1}}
stages: [rl]
data: {{task: sort, min_digits: 2, max_digits: 2, train_size: 16, eval_size: 4}}
model: {{hidden_size: 16, intermediate_size: 32, num_layers: 1, num_heads: 2,
        num_kv_heads: 1, max_position_embeddings: 16}}
rl: {{iterations: {steps}, prompts_per_iteration: 2, minibatches: 1, eval_every: 0,
     checkpoint_every: 0, generation: {{max_tokens: 2}}, critic: {{init: base}},
     rollout: {{num_blocks: 16, block_size: 4}}}}
"""


def troupe(args, state, check=True):
    r = subprocess.run([ARGS.troupe] + args + ["--state-dir", state], capture_output=True, text=True, timeout=7200)
    if check and r.returncode != 0:
        sys.exit("troupe %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
    return r


def run_job(tmp, state, name, steps):
    spec = os.path.join(tmp, name + ".yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(name=name, steps=steps))
    t0 = time.time()
    r = troupe(["submit", spec, "--wait"], state)
    job = r.stdout.split("\n")[0].strip()
    return job, time.time() - t0


def page_loads(d, url, job, loads):
    out = []
    for _ in range(loads):
        d.get(url + "/jobs/" + job)
        WebDriverWait(d, 120).until(lambda drv: drv.execute_script("return window.troupeReadyMs") is not None)
        out.append(d.execute_script("return window.troupeReadyMs"))
    info = d.execute_script(
        "return {charts: document.querySelectorAll('.chart canvas').length,"
        " points: Math.max(0, ...[...document.querySelectorAll('.chart')].map(c => +(c.dataset.points || 0))),"
        " snapshot: performance.getEntriesByType('resource').filter(e => e.name.includes('/snapshot'))"
        "   .map(e => ({ms: e.duration, bytes: e.encodedBodySize}))[0]}")
    return out, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--troupe", required=True)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--loads", type=int, default=7)
    global ARGS
    ARGS = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        ctl = subprocess.Popen([ARGS.troupe, "controller", "--listen", "127.0.0.1:0", "--dashboard", "127.0.0.1:0",
                                "--state-dir", state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            info = os.path.join(state, "controller.json")
            for _ in range(600):
                if os.path.exists(info):
                    break
                time.sleep(0.1)
            url = json.load(open(info))["dashboard"]
            small, _ = run_job(tmp, state, "short", 10)
            big, seconds = run_job(tmp, state, "long", ARGS.steps)
            print("job of %d steps ran in %.0f s" % (ARGS.steps, seconds))
            token = open(os.path.join(state, "token")).read().strip()
            opts = Options()
            opts.binary_location = "/usr/bin/chromium"
            for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                      "--window-size=1440,2000", "--user-data-dir=" + os.path.join(tmp, "chrome")):
                opts.add_argument(a)
            d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
            try:
                d.get(url + "/login")
                d.find_element(By.ID, "token").send_keys(token)
                d.find_element(By.ID, "login").click()
                WebDriverWait(d, 60).until(lambda drv: drv.execute_script("return document.body.dataset.ready") == "1")
                base, base_info = page_loads(d, url, small, ARGS.loads)
                long, long_info = page_loads(d, url, big, ARGS.loads)
            finally:
                d.quit()
            print("machine: %s, %d cores" % (open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
                                             os.cpu_count()))
            for name, times, i in (("10-step job", base, base_info), ("%d-step job" % ARGS.steps, long, long_info)):
                print("page of a %-16s median %6.0f ms, max %6.0f ms (%d charts, at most %d points each; "
                      "snapshot %d KB in %.0f ms)" % (name + ":", statistics.median(times), max(times), i["charts"],
                                                      i["points"], i["snapshot"]["bytes"] / 1024, i["snapshot"]["ms"]))
                print("    every load, in order: %s ms" % ", ".join("%.0f" % t for t in times))
            ok = max(long) < 1000
            print("ratio long / short: %.2fx; floor (< 1000 ms, every load): %s" %
                  (statistics.median(long) / statistics.median(base), "met" if ok else "NOT met"))
            return 0 if ok else 1
        finally:
            ctl.send_signal(signal.SIGTERM)
            ctl.wait(timeout=120)


if __name__ == "__main__":
    sys.exit(main())
