#!/usr/bin/env python3
"""A reward service for troupe jobs (`rl.reward.kind: remote`): a math
verifier with the extraction and equivalence rules of troupe's `math` rule
(docs/data-and-rewards.md), served over proto/troupe/v1/reward.proto.

    python3 examples/python/reward_server.py --port 50151 --token-file token

Any Python reward plugs in the same way: replace `score_sample` (one sample
in, a score out — and, optionally, per-token scores and named extras that
land in metrics.jsonl as reward/extra/<name>). Needs python3-grpcio and
python3-grpc-tools (Debian packages; scripts/setup.sh installs them).

Flags for tests and benchmarks: --port 0 picks a free port (written to
--port-file once serving), --delay adds seconds to every call, --report-load
adds the call's batch size and the calls in flight as extras, --constant
scores every sample with one number and skips the verifier.
"""
import fractions
import re
import tempfile
import threading
import time

import troupe_service


# ---- the math verifier (troupe's `math` rule, in Python) -----------------------

NUMBER_RUN = re.compile(r"-?[0-9.,]+")


def extract(mode, text):
    """The final answer of `text`: strict ("#### x"), flexible (the last
    number), boxed (the last \\boxed{...}), or none (all of it)."""
    if mode == "none":
        return text
    if mode == "strict":
        found = None
        for m in re.finditer(r"#### (-?[0-9.,]+)", text):
            found = m.group(1).replace(",", "")
        return found
    if mode == "flexible":
        runs = [r for r in NUMBER_RUN.findall(text) if any(c.isdigit() for c in r)]
        return runs[-1] if runs else None
    return last_boxed(text)


def brace_content(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
    return None


def last_boxed(text):
    at, name = text.rfind("\\boxed"), 6
    if at < 0:
        at, name = text.rfind("\\fbox"), 5
    if at < 0:
        return None
    rest = text[at + name:]
    if rest.startswith(" "):
        return rest[1:].split("$")[0]
    stripped = rest.lstrip(" \t\n")
    if not stripped.startswith("{"):
        return None
    return brace_content(stripped, 0)


def ground_truth(answer):
    strict = extract("strict", answer)
    if strict is not None:
        return strict
    boxed = last_boxed(answer)
    return boxed if boxed is not None else answer


def unwrap(s):
    for cmd in ("\\text", "\\mbox", "\\textbf", "\\mathrm"):
        while True:
            at = s.find(cmd + "{")
            if at < 0:
                break
            inner = brace_content(s, at + len(cmd))
            if inner is None:
                break
            s = s[:at] + inner + s[at + len(cmd) + 2 + len(inner):]
    return s


def normalize(text):
    s = text.strip()
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(open_) + len(close) and s.startswith(open_) and s.endswith(close):
            s = s[len(open_):len(s) - len(close)].strip()
            break
    s = unwrap(s)
    for drop in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle",
                 "^{\\circ}", "^\\circ", "\\$"):
        s = s.replace(drop, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = "".join(c for c in s if c not in " \t\n\r\f\v")
    return s.rstrip(".")


DECIMAL = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+|\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,2}))?$")


def parse_decimal(s):
    m = DECIMAL.match(s)
    if not m or (not m.group(2) and not m.group(3)):
        return None
    whole = m.group(2).replace(",", "")
    frac = m.group(3) or ""
    if len(whole) + len(frac) > 36:
        return None
    value = fractions.Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"),
                               10 ** len(frac))
    if m.group(4):
        value *= fractions.Fraction(10) ** int(m.group(4))
    return -value if m.group(1) == "-" else value


def parse_number(text):
    """(value, percent) of `text`, or None when it is not a number."""
    s = normalize(text)
    percent = s.endswith("%")
    if percent:
        s = s[:-1]
    value = None
    frac = re.match(r"^([+-]?)\\frac(?:\{([^{}]*)\}|(\d))(?:\{([^{}]*)\}|(\d))$", s)
    try:
        if frac:
            a = parse_decimal(frac.group(2) if frac.group(2) is not None else frac.group(3))
            b = parse_decimal(frac.group(4) if frac.group(4) is not None else frac.group(5))
            if a is not None and b:
                value = -(a / b) if frac.group(1) == "-" else a / b
        elif "/" in s:
            a, _, b = s.partition("/")
            a, b = parse_decimal(a), parse_decimal(b)
            if a is not None and b:
                value = a / b
        else:
            value = parse_decimal(s)
    except (ValueError, ZeroDivisionError):
        value = None
    return None if value is None else (value, percent)


def equivalent(answer, truth):
    a, b = parse_number(answer), parse_number(truth)
    if a and b:
        (x, xp), (y, yp) = a, b
        return x == y or (xp and not yp and x / 100 == y) or (yp and not xp and x == y / 100)
    na = normalize(answer)
    return bool(na) and na == normalize(truth)


def score_sample(sample, mode):
    """The reward of one sample (a troupe.v1.ScoreSample): 1 when its final
    answer equals the row's answer numerically, else 0."""
    found = extract(mode, sample.response)
    if found is None:
        return 0.0
    return 1.0 if equivalent(found, ground_truth(sample.answer)) else 0.0


# ---- the service ----------------------------------------------------------------

def make_servicer(pb2, pb2_grpc, args, token):
    class RewardService(pb2_grpc.RewardServiceServicer):
        def __init__(self):
            self.lock = threading.Lock()
            self.in_flight = 0

        def Score(self, request, context):
            troupe_service.check_token(context, token)
            with self.lock:
                self.in_flight += 1
                in_flight = self.in_flight
            try:
                if args.delay > 0:
                    time.sleep(args.delay)
                reply = pb2.ScoreResponse()
                for sample in request.samples:
                    s = reply.scores.add()
                    s.score = args.constant if args.constant is not None else \
                        score_sample(sample, args.extract)
                    if args.report_load:
                        s.extra["batch_size"] = len(request.samples)
                        s.extra["in_flight"] = in_flight
                return reply
            finally:
                with self.lock:
                    self.in_flight -= 1
    return RewardService()


def main():
    p = troupe_service.parser(__doc__)
    troupe_service.add_serving_flags(p, default_port=50151, workers=16)
    p.add_argument("--extract", default="strict", choices=["strict", "flexible", "boxed", "none"])
    p.add_argument("--delay", type=float, default=0.0, help="seconds added to every call")
    p.add_argument("--constant", type=float, help="score every sample with this")
    p.add_argument("--report-load", action="store_true",
                   help="extras: the call's batch size and the calls in flight")
    args = p.parse_args()
    token = troupe_service.read_token(args)
    with tempfile.TemporaryDirectory() as stubs:
        pb2, pb2_grpc = troupe_service.load_stubs(stubs, "reward")
        servicer = make_servicer(pb2, pb2_grpc, args, token)
        troupe_service.serve(
            args, lambda server: pb2_grpc.add_RewardServiceServicer_to_server(servicer, server),
            "reward server")


if __name__ == "__main__":
    main()
