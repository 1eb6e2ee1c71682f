#!/usr/bin/python3
"""A two-turn agent loop written against OpenAI's HTTP API with nothing but
Python's standard library (urllib), as agent code that knows nothing of
troupe would run through its OpenAI-compatible endpoint. Prints each
answer as one JSON line; run by agent_gateway_integration_test.cpp.

    agent_client.py --base-url URL --key KEY [--stream] [--rewrite]
"""
import argparse
import json
import sys
import urllib.error
import urllib.request

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an integer expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}


def post(base, key, path, body, headers=None):
    h = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def read_stream(text):
    """The assistant message of a streamed answer (server-sent events)."""
    message, finish, done = {"role": "assistant", "content": ""}, None, False
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        choice = json.loads(data)["choices"][0]
        delta = choice["delta"]
        if delta.get("content"):
            message["content"] += delta["content"]
        if delta.get("tool_calls"):
            message["tool_calls"] = delta["tool_calls"]
        finish = choice["finish_reason"] or finish
    assert done, "the stream did not end with [DONE]"
    return message, finish


def turn(a, messages):
    body = {"model": "troupe-policy", "messages": messages, "tools": [CALCULATOR],
            "max_tokens": 6, "logprobs": True, "temperature": 1.0, "seed": 7}
    if a.stream:
        body["stream"] = True
    status, text = post(a.base_url, a.key, "/chat/completions", body)
    if status != 200:
        sys.exit("chat/completions answered %d: %s" % (status, text))
    if a.stream:
        message, finish = read_stream(text)
        reply = {"message": message, "finish_reason": finish}
    else:
        answer = json.loads(text)
        choice = answer["choices"][0]
        reply = {"message": choice["message"], "finish_reason": choice["finish_reason"],
                 "logprobs": [c["logprob"] for c in choice["logprobs"]["content"]],
                 "usage": answer["usage"]}
    print(json.dumps(reply), flush=True)
    return reply["message"]


def answered(messages, answer, nudge):
    """The conversation after `answer`: the answer echoed back (as OpenAI's
    clients do), then the tool's result ("6") for each call, or the user's
    `nudge` when the model called no tool."""
    out = messages + [answer]
    if answer.get("tool_calls"):
        for call in answer["tool_calls"]:
            out.append({"role": "tool", "tool_call_id": call["id"], "content": "6"})
    else:
        out.append({"role": "user", "content": nudge})
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--rewrite", action="store_true",
                   help="a third call whose history drops the first answer")
    a = p.parse_args()
    messages = [{"role": "user", "content": "what is 2 times 3?"}]
    first = turn(a, messages)
    turn(a, answered(messages, first, "use the calculator"))
    if a.rewrite:
        turn(a, [{"role": "user", "content": "start again"}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
