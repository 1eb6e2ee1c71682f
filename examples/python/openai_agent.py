#!/usr/bin/env python3
"""Agent code as a troupe job's rollout (rl.agent.command; docs/agents.md,
"Agent code as the rollout"): an ordinary tool-using agent loop written
against OpenAI's chat completions API, with Python's standard library only.
It knows nothing of troupe but three environment variables the driver sets
for each iteration:

    OPENAI_BASE_URL     the endpoint's /v1 (this agent uses each task's own
                        base_url instead, which names its episode)
    OPENAI_API_KEY      the key every call carries
    TROUPE_AGENT_TASKS  a JSON Lines file: one episode per line, with its
                        first "messages", the "tools" offered, and sampling

Each episode: ask the model; run the tools it calls here, in the agent
(tools.py: calculator and lookup); send the results back; repeat until it
answers without a tool call or --max-turns is reached. The agent posts no
reward: the job's environment scores the last answer (or an agent may POST
{"reward": x} to <base_url>/episodes/<episode>/reward itself). troupe
records the exact tokens the engine sampled for every call, and trains on
them.

    python3 examples/python/openai_agent.py [--max-turns 3] [--parallel 16]
"""
import argparse
import concurrent.futures
import json
import os
import sys
import urllib.error
import urllib.request

from tools import run_tool


def chat(base_url, key, body):
    req = urllib.request.Request(base_url + "/chat/completions", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["choices"][0]["message"]
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"chat/completions answered {e.code}: {e.read().decode()}") from e


def run_episode(task, key, max_turns):
    messages = list(task["messages"])
    body = {"model": "troupe-policy", "max_tokens": task["max_tokens"],
            "temperature": task["temperature"], "top_p": task["top_p"]}
    if task["tools"]:
        body["tools"] = task["tools"]
    for _ in range(max_turns):
        message = chat(task["base_url"], key, dict(body, messages=messages))
        messages.append(message)  # sent back as answered: the history stays exact
        calls = message.get("tool_calls") or []
        if not calls:
            return
        for call in calls:
            f = call["function"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": f["name"],
                             "content": run_tool(f["name"], f["arguments"])})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-turns", type=int, default=3, help="model calls per episode at most")
    p.add_argument("--parallel", type=int, default=16, help="episodes run at once")
    a = p.parse_args()
    key = os.environ["OPENAI_API_KEY"]
    with open(os.environ["TROUPE_AGENT_TASKS"]) as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.parallel) as pool:
        futures = {pool.submit(run_episode, t, key, a.max_turns): t["episode"] for t in tasks}
        for done in concurrent.futures.as_completed(futures):
            if done.exception():
                failed += 1
                print(f"episode {futures[done]}: {done.exception()}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
