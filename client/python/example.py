#!/usr/bin/python3
"""Streams a generation from batond with the Python client.

    /usr/bin/python3 client/python/example.py [--endpoint EP] [GRAPH [PROMPT]]

GRAPH defaults to "chat" (config/examples/chat-cpu.yaml), PROMPT to a short
question. /usr/bin/python3 because Debian's python3-zmq and python3-protobuf
are installed for it (see baton_client's docstring); run `make` first so that
build/gen/python/baton_pb2.py exists.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baton_client  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default=None, help="default: $BATON_ENDPOINT or the daemon's")
    ap.add_argument("--input-name", default="prompt", help="the graph input that takes the text")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="cap the graph's decode_loop at this many iterations")
    ap.add_argument("graph", nargs="?", default="chat")
    ap.add_argument("prompt", nargs="?", default="What is the capital of France?")
    args = ap.parse_args()

    with baton_client.Client(args.endpoint) as client:
        health = client.health()
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
