#!/usr/bin/env python3
"""Submit a job to `troupe controller`, stream its events to the end and
read its metrics — with stubs generated from proto/troupe/v1/job_service.proto
(and node_service.proto, which it imports).

    python3 examples/python/submit_and_watch.py configs/quickstart.yaml \
        --set rl.iterations=5

The controller's address and token come from --address / --token-file, or
TROUPE_ADDRESS / TROUPE_TOKEN_FILE, or a controller on this machine
(--state-dir, default ~/.local/state/troupe). Needs python3-grpcio and
python3-grpc-tools (Debian packages; scripts/setup.sh installs them).
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile

import grpc
from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_stubs(out_dir):
    """Generates the Python stubs of the job API into out_dir and imports them."""
    proto_root = REPO / "proto"
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(proto_root / "troupe/v1/job_service.proto"),
            str(proto_root / "troupe/v1/node_service.proto")]
    if protoc.main(args) != 0:
        sys.exit("protoc failed on job_service.proto / node_service.proto")
    sys.path.insert(0, str(out_dir))
    from troupe.v1 import job_service_pb2, job_service_pb2_grpc  # noqa: E402
    return job_service_pb2, job_service_pb2_grpc


def connection(args):
    state_dir = pathlib.Path(args.state_dir or os.environ.get("TROUPE_STATE_DIR") or
                             pathlib.Path.home() / ".local/state/troupe")
    address = args.address or os.environ.get("TROUPE_ADDRESS")
    if not address:
        address = json.loads((state_dir / "controller.json").read_text())["address"]
    token_file = args.token_file or os.environ.get("TROUPE_TOKEN_FILE") or state_dir / "token"
    token = pathlib.Path(token_file).read_text().strip()
    return address, token


def spec_files(path):
    """The job file and the base files it names (sent along; the controller
    never reads a spec's files from its own disk)."""
    files, todo = [], [pathlib.Path(path)]
    while todo:
        p = todo.pop()
        text = p.read_text()
        files.append((str(p), text))
        for line in text.splitlines():
            if line.startswith("base:"):
                todo.append(p.parent / line.split(":", 1)[1].strip())
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--name", default="")
    ap.add_argument("--address")
    ap.add_argument("--token-file")
    ap.add_argument("--state-dir")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        pb, pb_grpc = load_stubs(tmp)
        address, token = connection(args)
        auth = [("authorization", f"Bearer {token}")]
        stub = pb_grpc.JobServiceStub(grpc.insecure_channel(address))

        files = spec_files(args.spec)
        request = pb.SubmitJobRequest(
            spec=pb.SpecFile(name=files[0][0], text=files[0][1]),
            bases=[pb.SpecFile(name=n, text=t) for n, t in files[1:]],
            overrides=args.overrides, name=args.name)
        try:
            job = stub.SubmitJob(request, metadata=auth, timeout=60)
        except grpc.RpcError as e:
            sys.exit(f"submit: {e.code().name}: {e.details()}")
        print(f"submitted {job.id}", flush=True)

        expected, final = 1, None
        for item in stub.WatchJob(pb.WatchJobRequest(id=job.id, from_seq=1), metadata=auth):
            if item.HasField("final"):
                final = item.final
                break
            event = item.event
            if event.seq != expected:
                sys.exit(f"event {event.seq} arrived where {expected} was due")
            expected += 1
            kind = event.WhichOneof("body")
            if kind == "metrics":
                m = event.metrics
                score = m.metrics.get("critic/score/mean")
                print(f"{m.stage} {m.step}/{m.total}" +
                      (f" score {score:.3f}" if score is not None else ""), flush=True)
            elif kind == "state":
                print(f"state {pb.JobState.Name(event.state.to)}", flush=True)

        metrics = stub.GetMetrics(pb.GetMetricsRequest(id=job.id, keys=["critic/score/mean"], stage="rl"),
                                  metadata=auth, timeout=60)
        print(f"events {expected - 1}, final {pb.JobState.Name(final.state)}, "
              f"rl metric points {len(metrics.points)}")
        return 0 if final.state == pb.JOB_STATE_SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
