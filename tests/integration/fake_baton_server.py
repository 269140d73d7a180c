#!/usr/bin/python3
"""A stand-in for batond's client socket, for testing clients without the
daemon: a ROUTER that answers the client protocol with canned behaviour.

    /usr/bin/python3 fake_baton_server.py ENDPOINT LOGFILE

Every ClientMessage received is appended to LOGFILE as one JSON line, so a
test can check what the client put on the wire. Graphs:
  missing  -> NOT_FOUND
  limits   -> OK, finish_reason STOP, the message saying back stop, max_tokens,
              text_output and raw_inputs
  slow     -> held until cancelled (CANCELLED) or past timeout_ms (DEADLINE_EXCEEDED);
              a cancel is answered at once (NOT_FOUND for an id not held)
  garbage  -> a frame that is not a ServerMessage, then nothing
  other    -> echo: with stream, each U8 input is sent as text chunks (one per
              word, named "text"; for graph "named", named as the input) and
              left out of the response; every other input comes back as an
              output of the same name. One timing entry per input.
It exits after 60 s without a message, or on SIGTERM.
"""

import os
import sys
import time

import zmq
from google.protobuf import json_format

sys.path.insert(0, os.environ.get("BATON_PROTO_PATH", "build/gen/python"))
import baton_pb2 as pb  # noqa: E402


def send(sock, peer, msg):
    sock.send_multipart([peer, msg.SerializeToString()])


def respond(sock, peer, rid, code, message="", outputs=(), timings=()):
    m = pb.ServerMessage()
    r = m.response
    r.request_id = rid
    r.status.code = code
    r.status.message = message
    for t in outputs:
        r.outputs.append(t)
    for node, it in timings:
        r.timings.add(node=node, iteration=it, worker="cpu0", queue_us=3, exec_us=7)
    r.total_us = 1500
    send(sock, peer, m)


def echo(sock, peer, req):
    outputs, seq = [], 0
    for t in req.inputs:
        if req.stream and t.dtype == pb.U8:
            words = t.data.split(b" ")
            for k, w in enumerate(words):
                piece = w + (b" " if k + 1 < len(words) else b"")
                m = pb.ServerMessage()
                m.chunk.request_id = req.request_id
                m.chunk.seq = seq
                m.chunk.value.name = t.name if req.graph == "named" else "text"
                m.chunk.value.dtype = pb.U8
                m.chunk.value.dims.append(len(piece))
                m.chunk.value.data = piece
                m.chunk.value.modality = "text"
                send(sock, peer, m)
                seq += 1
            continue
        out = pb.Tensor()
        out.CopyFrom(t)
        out.modality = "text" if t.dtype == pb.U8 else "tensor"
        outputs.append(out)
    respond(sock, peer, req.request_id, pb.OK, outputs=outputs,
            timings=[("echo", i) for i in range(len(req.inputs))])


def main():
    endpoint, logpath = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    # Nothing here may block for ever (a ROUTER's sends do not; its
    # receives follow a poll): the limits say so, and closing drops what
    # a gone client did not read.
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 10000)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.bind(endpoint)
    held = {}  # request_id -> (peer, deadline or None) of "slow" requests
    log = open(logpath, "a")
    last = time.monotonic()
    while time.monotonic() - last < 60:
        if sock.poll(50):
            last = time.monotonic()
            peer, frame = sock.recv_multipart()
            msg = pb.ClientMessage.FromString(frame)
            log.write(json_format.MessageToJson(msg, indent=None) + "\n")
            log.flush()
            kind = msg.WhichOneof("msg")
            if kind == "infer":
                req = msg.infer
                if req.graph == "missing":
                    respond(sock, peer, req.request_id, pb.NOT_FOUND,
                            "unknown graph 'missing'")
                elif req.graph == "slow":
                    held[req.request_id] = (peer, time.monotonic() + req.timeout_ms / 1000.0
                                            if req.timeout_ms else None)
                elif req.graph == "garbage":
                    sock.send_multipart([peer, b"\xff\xff\xff"])
                elif req.graph == "unread":
                    # As batond answers a frame over max_message_bytes: no id.
                    respond(sock, peer, "", pb.RESOURCE_EXHAUSTED,
                            "the frame is over max_message_bytes")
                elif req.graph == "usage":
                    m = pb.ServerMessage()
                    r = m.response
                    r.request_id = req.request_id
                    r.usage.prompt_tokens, r.usage.completion_tokens = 7, 3
                    r.usage.total_tokens = 10
                    r.loop_ends["decode_loop"] = pb.LOOP_END_MAX_ITERS
                    send(sock, peer, m)
                elif req.graph == "limits":
                    # Says back the text limits it got; ends as by a stop string.
                    m = pb.ServerMessage()
                    r = m.response
                    r.request_id = req.request_id
                    r.status.message = "stop=%r max_tokens=%d text_output=%s raw_inputs=%r" % (
                        list(req.stop), req.max_tokens, req.text_output, list(req.raw_inputs))
                    r.finish_reason = pb.FINISH_REASON_STOP
                    send(sock, peer, m)
                elif req.graph == "conversation":
                    # Says back what arrived: each turn, then the input.
                    respond(sock, peer, req.request_id, pb.OK,
                            "|".join("%s:%s" % (m.role, m.content) for m in req.messages) +
                            "@" + req.messages_input)
                else:
                    echo(sock, peer, req)
            elif kind == "cancel":
                # Answered at once, as batond does; a held request then ends.
                rid = msg.cancel.request_id
                m = pb.ServerMessage()
                m.cancel.request_id = rid
                if rid in held:
                    send(sock, peer, m)
                    held_peer, _ = held.pop(rid)
                    respond(sock, held_peer, rid, pb.CANCELLED, "cancelled by the client")
                else:
                    m.cancel.status.code = pb.NOT_FOUND
                    m.cancel.status.message = "no request '%s' is in flight" % rid
                    send(sock, peer, m)
            elif kind == "health":
                m = pb.ServerMessage()
                m.health.live = m.health.ready = True
                m.health.workers_ready.append("cpu0")
                m.health.message = "fake"
                send(sock, peer, m)
            elif kind == "stats":
                m = pb.ServerMessage()
                m.stats.text = "baton_requests_total 1\n"
                send(sock, peer, m)
            elif kind == "inspect":
                m = pb.ServerMessage()
                m.inspect.text = "graph %s: 1 nodes, 0 loops, 0 edges; inputs: prompt\n" % (
                    msg.inspect.graph or "chat")
                send(sock, peer, m)
        now = time.monotonic()
        for rid, (peer, deadline) in list(held.items()):
            if deadline is not None and now >= deadline:
                del held[rid]
                respond(sock, peer, rid, pb.DEADLINE_EXCEEDED, "deadline passed")
    sock.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
