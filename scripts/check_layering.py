#!/usr/bin/env python3
"""Checks that the source tree's includes follow the layering of ARCHITECTURE.md.

    runtime <- kernels <- models <- actors <- cluster <- apps

Reads every `#include "folder/..."` of the library folders and reports, as
`file:line: message`, each include that

- points up the DAG (a lower folder including a higher one);
- names a generated gRPC header (`*.grpc.pb.h`) outside cluster/ and apps/,
  or a generated protobuf header (`*.pb.h`) in a folder that may not use
  them (only runtime's plain messages, cluster and apps may);
- goes from actors/train to actors/inference (trainer and rollout share the
  weight channel through actors/weight_channel.hpp, neither owns the other),
  or from actors/job to actors/rl (the job actor is generic over drivers);
- brings <torch/...> into a public header of runtime/, actors/, cluster/ or
  apps/ (ARCHITECTURE.md rule 6: those headers stay light).

Usage: check_layering.py [ROOT]   (ROOT: the repository, default: this
script's parent's parent). Exits 1 when anything is reported, 0 otherwise.
"""

import os
import re
import sys

# Bottom to top: a folder may include its own and lower folders only.
LAYERS = ["runtime", "kernels", "models", "actors", "cluster", "apps"]
# Folders whose sources are read (proto holds only .proto files and is
# compiled by protoc; tests/, bench/ and examples/ sit above everything).
SOURCE_SUFFIXES = (".hpp", ".cpp", ".h", ".cc", ".cu", ".cuh")
# Sub-folder arrows that the DAG between top-level folders does not see.
FORBIDDEN_SUBFOLDER_ARROWS = [
    ("actors/train", "actors/inference",
     "the trainer must not include the rollout (share actors/weight_channel.hpp)"),
    ("actors/job", "actors/rl",
     "the generic job actor must not include the RL driver"),
]
GRPC_ALLOWED = {"cluster", "apps"}
PROTOBUF_ALLOWED = {"runtime", "cluster", "apps"}
LIGHT_HEADER_FOLDERS = {"runtime", "actors", "cluster", "apps"}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def source_files(root):
    """Yields (path relative to root, top-level folder) of every source file."""
    for layer in LAYERS:
        base = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    full = os.path.join(dirpath, name)
                    yield os.path.relpath(full, root).replace(os.sep, "/"), layer


def includes(path):
    """Yields (line number, delimiter, included name) of a file's includes."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if m:
                yield number, m.group(1), m.group(2)


def check_include(rel, layer, delim, name):
    """The problems of one include, as messages (empty when it is fine)."""
    problems = []
    if name.endswith(".grpc.pb.h"):
        if layer not in GRPC_ALLOWED:
            problems.append(f'generated gRPC header "{name}" outside cluster/ and apps/')
    elif name.endswith(".pb.h"):
        if layer not in PROTOBUF_ALLOWED:
            problems.append(f'generated protobuf header "{name}" in {layer}/')
    if delim == '"':
        top = name.split("/", 1)[0]
        if top in LAYERS and LAYERS.index(top) > LAYERS.index(layer):
            problems.append(f'"{name}": {layer}/ includes {top}/, which sits above it '
                            f"({' <- '.join(LAYERS)})")
        for source, target, why in FORBIDDEN_SUBFOLDER_ARROWS:
            if rel.startswith(source + "/") and name.startswith(target + "/"):
                problems.append(f'"{name}": {source} -> {target}: {why}')
    elif name.startswith("torch/") and layer in LIGHT_HEADER_FOLDERS and rel.endswith(".hpp"):
        problems.append(f"<{name}> in a public header of {layer}/ "
                        "(keep LibTorch's full headers in .cpp files)")
    return problems


def check_tree(root):
    """Every problem of the tree at root, as 'file:line: message' strings."""
    report = []
    for rel, layer in source_files(root):
        for number, delim, name in includes(os.path.join(root, rel)):
            for problem in check_include(rel, layer, delim, name):
                report.append(f"{rel}:{number}: {problem}")
    return report


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not all(os.path.isdir(os.path.join(root, layer)) for layer in ("runtime", "actors")):
        print(f"check_layering: {root} does not look like the troupe tree", file=sys.stderr)
        return 2
    report = check_tree(root)
    for line in report:
        print(line)
    files = sum(1 for _ in source_files(root))
    print(f"check_layering: {files} files, {len(report)} problem(s)")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
