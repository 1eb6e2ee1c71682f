#!/usr/bin/python3
"""The dashboard in a real browser: Debian's headless Chromium driven by
python3-selenium through chromium-driver. Logs in, finds the job on the jobs
page, opens it, waits for its charts to grow, pauses and resumes it from the
page, and fails on any console error. Screenshots go to --artifacts.

Run by dashboard_integration_test.cpp, which starts the controller and the
job; exit status 0 = every check passed."""
import argparse
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def browser(user_dir):
    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1440,2000", "--user-data-dir=" + user_dir, "--no-first-run"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--expect-turns", type=int, default=0,
                    help="the evaluation samples show conversations of this many model turns")
    a = ap.parse_args()
    token = open(a.token_file).read().strip()
    os.makedirs(a.artifacts, exist_ok=True)
    with tempfile.TemporaryDirectory() as user_dir:
        d = browser(user_dir)
        d.set_page_load_timeout(60)
        wait = WebDriverWait(d, 120)
        shot = lambda name: d.save_screenshot(os.path.join(a.artifacts, name + ".png"))
        ready = lambda drv: drv.execute_script("return document.body.dataset.ready") == "1"
        state = lambda: d.execute_script(
            "const s = document.querySelector('#head .state'); return s ? s.dataset.state : ''")
        try:
            # Not logged in: the job's page sends the browser to the login form.
            d.get(a.url + "/jobs/" + a.job)
            wait.until(lambda drv: drv.current_url.endswith("/login"))
            d.find_element(By.ID, "token").send_keys(token)
            d.find_element(By.ID, "login").click()
            wait.until(ready)
            wait.until(lambda drv: drv.find_elements(By.CSS_SELECTOR, 'tr[data-id="%s"]' % a.job))
            shot("jobs")

            d.get(a.url + "/jobs/" + a.job)
            wait.until(ready)
            points = lambda: d.execute_script(
                "return Math.max(0, ...[...document.querySelectorAll('.chart')]"
                ".map(c => +(c.dataset.points || 0)))")
            wait.until(lambda drv: points() >= 2)
            before = points()
            wait.until(lambda drv: points() > before)
            charts = d.execute_script("return document.querySelectorAll('.chart canvas').length")
            assert charts >= 6, "only %d charts drawn" % charts
            assert d.find_elements(By.CSS_SELECTOR, "#placement .proc"), "no processes in the placement map"
            assert d.find_elements(By.CSS_SELECTOR, "#events tr"), "no events listed"
            assert "rl:" in d.find_element(By.ID, "config").text, "no resolved config"
            if a.expect_turns:
                # An episode's conversation: the model's turns marked, the
                # observation between them (docs/agents.md).
                turns = lambda: d.execute_script(
                    "return [...document.querySelectorAll('#samples .conversation .msg.role-assistant')]"
                    ".map(m => +m.dataset.turn)")
                wait.until(lambda drv: a.expect_turns in turns())
                tags = d.execute_script(
                    "return [...document.querySelectorAll('#samples .conversation .msg-tag')]"
                    ".map(t => t.textContent)")
                assert "turn %d · assistant" % a.expect_turns in tags, "turn tags: %s" % tags
                assert any(t.startswith("turn 1 · ") and "assistant" not in t for t in tags), \
                    "no observation after turn 1: %s" % tags
                d.execute_script("document.getElementById('samples').scrollIntoView()")
                shot("samples")
                d.execute_script("window.scrollTo(0, 0)")
            shot("job")

            # Clicked from the page's script: the head is re-rendered as
            # events come, so an element found a moment ago may be gone.
            click = lambda button: d.execute_script(
                "const b = document.getElementById(arguments[0]); if (b && !b.disabled) b.click();"
                " return !!b && !b.disabled", button)
            wait.until(lambda drv: click("do-pause"))
            wait.until(lambda drv: state() == "paused")
            shot("paused")
            wait.until(lambda drv: click("do-resume"))
            wait.until(lambda drv: state() == "running")
            after = points()
            wait.until(lambda drv: points() > after)

            errors = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
            assert not errors, "console errors: %s" % errors
            print("browser: ok (%d charts, %d points in the longest series)" % (charts, points()))
            return 0
        except Exception as e:  # the screenshot tells what the page showed
            shot("failure")
            print("browser: FAILED: %r" % (e,), file=sys.stderr)
            for entry in d.get_log("browser"):
                print("console: %s" % entry, file=sys.stderr)
            return 1
        finally:
            d.quit()


if __name__ == "__main__":
    sys.exit(main())
