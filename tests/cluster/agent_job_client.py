#!/usr/bin/python3
"""A job's agent (rl.agent.command) for agent_job_integration_test.cpp: reads
the task file the driver wrote (TROUPE_AGENT_TASKS) and runs each episode's
agent loop against the OpenAI-compatible endpoint with Python's standard
library only — two calls per episode (the second after the tool's results,
or a user turn when the model called none) — then posts the episode's
reward. Appends what it was answered to --record, one JSON object per
episode, so the test can compare it with what the trainer trained on.

    agent_job_client.py --record FILE [--reward parity|none] [--by-header]
                        [--rewrite-first] [--unrewarded N] [--skip N] [--hang]
                        [--exit-code N]
"""
import argparse
import json
import os
import sys
import time

from agent_client import answered, post


def chat(base, key, body, episode=None):
    headers = {"X-Troupe-Episode": episode} if episode else None
    status, text = post(base, key, "/chat/completions", body, headers)
    if status != 200:
        sys.exit("chat/completions answered %d: %s" % (status, text))
    choice = json.loads(text)["choices"][0]
    return choice["message"], [c["logprob"] for c in choice["logprobs"]["content"]]


def run_episode(a, task, key, index):
    # Odd episodes name themselves by header on the endpoint's root.
    by_header = a.by_header and index % 2 == 1
    base = os.environ["OPENAI_BASE_URL"] if by_header else task["base_url"]
    episode = task["episode"] if by_header else None
    body = {"model": "troupe-policy", "max_tokens": task["max_tokens"], "logprobs": True,
            "temperature": task["temperature"], "top_p": task["top_p"]}
    if task["tools"]:
        body["tools"] = task["tools"]
    messages = list(task["messages"])
    first, lp1 = chat(base, key, dict(body, messages=messages), episode)
    messages = answered(messages, first, "go on")
    second, lp2 = chat(base, key, dict(body, messages=messages), episode)
    record = {"episode": task["episode"], "logprobs": lp1 + lp2, "calls": 2,
              "final": second.get("content") or ""}
    if a.rewrite_first and index == 0:
        # A rewritten history: the last trajectory is this call alone.
        third, lp3 = chat(base, key, dict(body, messages=task["messages"][:1]), episode)
        record.update(logprobs=lp3, calls=1, final=third.get("content") or "")
    if a.reward == "parity" and index >= a.unrewarded:
        reward = 1.0 if len(record["final"]) % 2 == 0 else 0.0
        status, text = post(task["base_url"], key, "/episodes/%s/reward" % task["episode"],
                            {"reward": reward})
        if status != 200:
            sys.exit("reward answered %d: %s" % (status, text))
        record["reward"] = reward
    return record


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--record", required=True)
    p.add_argument("--reward", choices=["parity", "none"], default="parity")
    p.add_argument("--by-header", action="store_true")
    p.add_argument("--rewrite-first", action="store_true")
    p.add_argument("--unrewarded", type=int, default=0, help="the first N episodes post none")
    p.add_argument("--skip", type=int, default=0, help="the first N episodes make no call")
    p.add_argument("--hang", action="store_true", help="never ends")
    p.add_argument("--exit-code", type=int, default=0)
    a = p.parse_args()
    key = os.environ["OPENAI_API_KEY"]
    with open(os.environ["TROUPE_AGENT_TASKS"]) as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    if a.hang:
        while True:
            time.sleep(1)
    with open(a.record, "a") as out:
        for i, task in enumerate(tasks):
            if i < a.skip:
                continue
            out.write(json.dumps(run_episode(a, task, key, i)) + "\n")
    return a.exit_code


if __name__ == "__main__":
    sys.exit(main())
