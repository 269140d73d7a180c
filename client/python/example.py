#!/usr/bin/python3
"""Streams a generation from batond with the Python client.

    /usr/bin/python3 client/python/example.py [--endpoint EP] [GRAPH [PROMPT]]

GRAPH defaults to "chat" (config/examples/chat-cpu.yaml), PROMPT to a short
question, the endpoint to $BATON_ENDPOINT, else the one `make run` serves
(ipc:///tmp/baton/baton.sock). /usr/bin/python3 because Debian's python3-zmq and python3-protobuf
are installed for it (see baton_client's docstring); run `make` first so that
build/gen/python/baton_pb2.py exists.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import baton_client  # noqa: E402
except ImportError as e:
    sys.exit("example.py: %s" % e)

MAKE_RUN_ENDPOINT = "ipc:///tmp/baton/baton.sock"  # config/examples/chat-cpu.yaml


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=os.environ.get("BATON_ENDPOINT") or MAKE_RUN_ENDPOINT,
                    help="default: $BATON_ENDPOINT, else %s (make run)" % MAKE_RUN_ENDPOINT)
    ap.add_argument("--input-name", default="prompt", help="the graph input that takes the text")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="cap the graph's decode_loop at this many iterations")
    ap.add_argument("graph", nargs="?", default="chat")
    ap.add_argument("prompt", nargs="?", default="What is the capital of France?")
    args = ap.parse_args()

    with baton_client.Client(args.endpoint) as client:
        try:
            health = client.health(timeout_ms=3000)
        except baton_client.BatonError as e:
            print("example.py: no answer from batond at %s (%s); is it running? `make run` "
                  "starts it, --endpoint names another" % (args.endpoint, e), file=sys.stderr)
            return 3
        if not health.ready:
            print("daemon not ready: %s" % health.message, file=sys.stderr)
            return 1
        response = None
        pieces = []
        for ev in client.stream(args.graph, {args.input_name: args.prompt},
                                sampling={"temperature": 0.0, "seed": 1},
                                max_iters={"decode_loop": args.max_tokens} if args.max_tokens
                                else None):
            if ev.is_chunk:
                pieces.append(ev.tensor.data)
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            else:
                response = ev
        print()
        print("%s: %d chunks, %.1f ms, %d node runs" % (
            response.status, len(pieces), response.total_us / 1000.0, len(response.timings)),
            file=sys.stderr)
        if not response.ok:
            print(response.message, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
