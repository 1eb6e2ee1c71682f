"""What troupe's reference services in Python share (reward_server.py,
tool_env_server.py): the stubs generated from a proto of the repository,
the bearer-token check, and serving on a port — clear text on loopback only,
TLS otherwise — with the bound port written atomically for callers that
asked for any free one."""
import argparse
import concurrent.futures
import hmac
import pathlib
import sys

import grpc
from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_stubs(out_dir, name):
    """Generates the stubs of proto/troupe/v1/<name>.proto into out_dir and
    imports them: (<name>_pb2, <name>_pb2_grpc)."""
    proto_root = REPO / "proto"
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(proto_root / f"troupe/v1/{name}.proto")]
    if protoc.main(args) != 0:
        sys.exit(f"protoc failed on {name}.proto")
    sys.path.insert(0, str(out_dir))
    pb2 = __import__(f"troupe.v1.{name}_pb2", fromlist=["_"])
    pb2_grpc = __import__(f"troupe.v1.{name}_pb2_grpc", fromlist=["_"])
    return pb2, pb2_grpc


def add_serving_flags(p, default_port, workers):
    """The flags of serve(): where, TLS, the token, the worker threads."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port, help="0 = any free port")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--token-file", help="refuse calls without this bearer token")
    p.add_argument("--tls-cert", help="serve TLS with this certificate (PEM)")
    p.add_argument("--tls-key", help="... and this key (PEM)")
    p.add_argument("--workers", type=int, default=workers, help="calls served at once")


def read_token(args):
    return pathlib.Path(args.token_file).read_text().strip() if args.token_file else None


def check_token(context, token):
    """Aborts the call with UNAUTHENTICATED unless it carries the token."""
    if token is None:
        return
    sent = dict(context.invocation_metadata()).get("authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      "missing or wrong 'authorization: Bearer <token>'")


def serve(args, add_servicer, what):
    """Serves until killed: add_servicer(server) registers the service."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=args.workers))
    add_servicer(server)
    address = f"{args.host}:{args.port}"
    if args.tls_cert and args.tls_key:
        pair = (pathlib.Path(args.tls_key).read_bytes(), pathlib.Path(args.tls_cert).read_bytes())
        port = server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
    elif args.host in ("127.0.0.1", "::1", "localhost"):
        port = server.add_insecure_port(address)
    else:
        sys.exit(f"{args.host} is not loopback: serve TLS (--tls-cert, --tls-key) so that "
                 "tokens and data do not cross the network in clear text")
    if port == 0:
        sys.exit(f"cannot listen on {args.host}:{args.port}")
    server.start()
    if args.port_file:
        tmp = pathlib.Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.rename(args.port_file)
    print(f"{what} on {args.host}:{port}", flush=True)
    server.wait_for_termination()


def parser(doc):
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])
