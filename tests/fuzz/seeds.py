#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (NOTE [fuzz targets]) from the
project's own files and formats: heartbeat datagrams, the job YAML seeds from configs/ (each job file with
its chain of base files renamed to the target's b1.yaml, b2.yaml, ..., and
one with --set overrides), the journal seeds from an events.jsonl that a
troupe run wrote (one line per event kind, and the first lines of the
journal with a torn last line). Usage: seeds.py [EVENTS_JSONL]."""
import json
import os
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def write(target, name, text):
    folder = os.path.join(here, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(text)


def heartbeat_seeds():
    """Heartbeat datagrams (cluster/heartbeats.cpp's two forms). The target
    checks that an accepted datagram encodes back to its bytes, so these
    are the encoder's output or the replay test fails."""
    import struct

    def calls(rank, pid, entries):
        out = struct.pack(">IIQI", 0x74726863, rank, pid, len(entries))
        for group, r, size, age, op in entries:
            out += struct.pack(">QIIII", group, r, size, age, op)
        return out

    folder = os.path.join(here, "corpus", "heartbeat")
    os.makedirs(folder, exist_ok=True)
    seeds = {
        "v1": struct.pack(">IIQ", 0x74726862, 3, 4242),
        "one-call": calls(1, 77, [(0x8E14C585D8123361, 1, 2, 2007, 0)]),
        "eight-calls": calls(0, 9, [(100 + i, i % 4, 4, 1000 * i, i % 13) for i in range(8)]),
        "one-rank-group": calls(2, 5, [(7, 0, 1, 4294967295, 12)]),
    }
    for name, data in seeds.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def job_with_bases(path):
    """The job file and its base chain in the target's input form."""
    sections, names = [], {}
    current = path
    while current:
        with open(current, encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"^base:\s*(\S+)\s*$", text, re.M)
        nxt = None
        if m:
            nxt = os.path.join(os.path.dirname(current), m.group(1))
            names[nxt] = "b%d.yaml" % (len(names) + 1)
            text = text[: m.start(1)] + names[nxt] + text[m.end(1):]
        sections.append(text)
        current = nxt
    return "\n%%\n".join(sections)


def job_seeds():
    configs = os.path.join(root, "configs")
    for name in sorted(os.listdir(configs)):
        if name.endswith(".yaml") and name != "reference.yaml":
            write("job_yaml", name, job_with_bases(os.path.join(configs, name)))
    with open(os.path.join(configs, "quickstart.yaml"), encoding="utf-8") as f:
        quick = f.read()
    write("job_yaml", "quickstart-with-sets.yaml",
          quick + "\n%%\n--set\nrl.iterations=3\nplacement.mode=colocated\n"
          "supervision.roles=[{role: rollout, max_restarts: 2}]\n")


def journal_seeds(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # The run's folder as a relative one (no machine's paths in the repo).
    run_dir = os.path.dirname(os.path.abspath(path))
    text = text.replace(run_dir, "runs/seed")
    lines = [l for l in text.split("\n") if l]
    kinds = {}
    for line in lines:
        kind = json.loads(line).get("kind", "")
        kinds.setdefault(kind, line)
    for kind, line in sorted(kinds.items()):
        write("journal", "event-%s.jsonl" % kind, line + "\n")
    head = "\n".join(lines[:12]) + "\n"
    write("journal", "journal-head.jsonl", head)
    write("journal", "journal-torn.jsonl", head + lines[12][: len(lines[12]) // 2])


if __name__ == "__main__":
    heartbeat_seeds()
    job_seeds()
    if len(sys.argv) > 1:
        journal_seeds(sys.argv[1])
