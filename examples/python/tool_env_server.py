#!/usr/bin/env python3
"""A multi-turn environment for troupe jobs (`rl.environment.kind: remote`)
with two tools, a calculator and a lookup table, served over
proto/troupe/v1/environment.proto (docs/agents.md).

    python3 examples/python/tool_env_server.py --port 50161 --token-file token

Each session is a data row: its prompt is the first observation, and the
model may call `calculator` ({"expression": "48213 * 97"}: integers with
+ - * and parentheses, exact at any length) and `lookup` ({"key": "pi"}) as
often as it likes; the turn without a tool call is its answer, scored 1 when
it equals the row's answer (whitespace trimmed) and 0 otherwise. Any
environment plugs in the same way: replace `start` (a row in, the first
observation out) and `turn` (the model's turn in, an observation or the end
out). Needs python3-grpcio and python3-grpc-tools (Debian packages;
scripts/setup.sh installs them).

Flags for tests and benchmarks: --port 0 picks a free port (written to
--port-file once serving), --delay adds seconds to every Step, --hang-at-turn
N never answers turn N, --crash-at-turn N ends the process at turn N,
--garbage answers turn 1 with a reward that is not a number, --shaping X
rewards each turn with a successful tool call with X, --echo answers every
turn with its text as an observation and never ends (the runner's turn limit
does).
"""
import json
import os
import tempfile
import threading
import time

import troupe_service
from tools import CALCULATOR, LOOKUP, run_tool

# ---- the environment ----------------------------------------------------------------

class Sessions:
    """What the environment keeps per session: the row's answer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answers = {}

    def start(self, task):
        with self.lock:
            self.answers[task.session_id] = task.answer.strip()

    def answer(self, session):
        with self.lock:
            return self.answers.get(session)

    def end(self, session):
        with self.lock:
            self.answers.pop(session, None)


def make_servicer(pb2, pb2_grpc, args, token):
    sessions = Sessions()

    def check_token(context):
        troupe_service.check_token(context, token)

    def start(task, result):
        """The first observation of a row: its conversation, or its prompt."""
        sessions.start(task)
        if task.messages_json:
            for m in json.loads(task.messages_json):
                result.observation.messages.add(role=m.get("role", "user"),
                                                content=str(m.get("content", "")))
        else:
            result.observation.text = task.prompt
        result.tools_json.extend([json.dumps(CALCULATOR), json.dumps(LOOKUP)])

    def turn(t, result):
        """The model's turn: tool results, or the end with the answer's score."""
        if args.echo:
            result.observation.text = f"[{t.turn}:{t.text}]"
            return
        if t.tool_calls:
            ok = 0
            for call in t.tool_calls:
                out = run_tool(call.name, call.arguments_json)
                ok += not out.startswith("error:")
                result.observation.messages.add(role="tool", name=call.name,
                                                tool_call_id=call.id, content=out)
            result.reward = args.shaping if ok else 0.0
            result.info["tool_calls"] = len(t.tool_calls)
            return
        answer = sessions.answer(t.session_id)
        result.done = True
        result.reward = 1.0 if answer is not None and t.content.strip() == answer else 0.0
        sessions.end(t.session_id)

    class EnvironmentService(pb2_grpc.EnvironmentServiceServicer):
        def Reset(self, request, context):
            check_token(context)
            reply = pb2.ResetResponse()
            for task in request.tasks:
                r = reply.results.add(session_id=task.session_id)
                start(task, r)
            return reply

        def Step(self, request, context):
            check_token(context)
            if args.delay > 0:
                time.sleep(args.delay)
            reply = pb2.StepResponse()
            for t in request.turns:
                if t.turn == args.hang_at_turn:
                    threading.Event().wait()
                if t.turn == args.crash_at_turn:
                    os._exit(3)
                r = reply.results.add(session_id=t.session_id)
                turn(t, r)
                if args.garbage and t.turn == 1:
                    r.reward = float("nan")
            return reply

        def Close(self, request, context):
            check_token(context)
            for s in request.session_ids:
                sessions.end(s)
            return pb2.CloseResponse()

    return EnvironmentService()


def main():
    p = troupe_service.parser(__doc__)
    troupe_service.add_serving_flags(p, default_port=50161, workers=64)
    p.add_argument("--delay", type=float, default=0.0, help="seconds added to every Step")
    p.add_argument("--hang-at-turn", type=int, default=0, help="never answer this turn")
    p.add_argument("--crash-at-turn", type=int, default=0, help="end the process at this turn")
    p.add_argument("--garbage", action="store_true", help="a NaN reward at turn 1")
    p.add_argument("--shaping", type=float, default=0.0,
                   help="reward of a turn with a successful tool call")
    p.add_argument("--echo", action="store_true",
                   help="answer each turn with its text; never end")
    args = p.parse_args()
    token = troupe_service.read_token(args)
    with tempfile.TemporaryDirectory() as stubs:
        pb2, pb2_grpc = troupe_service.load_stubs(stubs, "environment")
        servicer = make_servicer(pb2, pb2_grpc, args, token)
        troupe_service.serve(
            args,
            lambda server: pb2_grpc.add_EnvironmentServiceServicer_to_server(servicer, server),
            "environment server")


if __name__ == "__main__":
    main()
