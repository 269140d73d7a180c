#!/usr/bin/python3
"""The Python client (client/python/baton_client.py) against
fake_baton_server.py. Usage: test_python_client.py ENDPOINT. Prints one line
per failed check and exits 1 if any failed; /usr/bin/python3 because the
Debian python3-zmq / python3-protobuf packages are installed for it."""

import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "client", "python"))
import baton_client as bc  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL: python client: %s" % what)


def raises(exc, fn):
    try:
        fn()
    except exc:
        return True
    except Exception as e:  # a different error is a failure too
        print("  (raised %r)" % e)
    return False


def main():
    ep = sys.argv[1]
    with bc.Client(ep) as c:
        h = c.health()
        check(h.live and h.ready and h.workers_ready == ["cpu0"], "health: %r" % (h,))
        check(c.stats().startswith("baton_requests_total"), "stats")
        check("inputs: prompt" in c.inspect("chat"), "inspect")

        x = bc.Tensor("x", "i32", [2, 2], struct.pack("<4i", 1, 2, 3, -4))
        r = c.infer("g", {"x": x, "prompt": "hello there"}, max_iters={"loop": 3},
                    sampling={"temperature": 0.5, "seed": 9})
        check(r.ok and r.status == "OK", "echo status: %r" % r)
        check(r.text("prompt") == "hello there", "echo text output")
        xt = r.tensors["x"]
        check(xt.dtype == "i32" and xt.dims == (2, 2) and xt.data == x.data, "echo tensor")
        if bc.np is not None:
            check(r.outputs["x"].tolist() == [[1, 2], [3, -4]], "numpy output")
        else:
            check(r.outputs["x"] is xt, "raw output without numpy")
        check([t.node for t in r.timings] == ["echo", "echo"], "timings")

        r = c.infer("conversation", messages=[{"role": "system", "content": "be brief"},
                                              ("user", "hi")], messages_input="prompt")
        check(r.ok and r.message == "system:be brief|user:hi@prompt", "messages: %r" % r.message)
        # A refusal without an id (a frame the daemon did not read) ends the
        # request waited on, streamed or not, rather than leaving it waiting.
        r = c.infer("unread", wait_ms=5000)
        check(r.status == "RESOURCE_EXHAUSTED" and "max_message_bytes" in r.message,
              "a refusal without an id: %r" % r)
        events = list(c.stream("unread", wait_ms=5000))
        check(len(events) == 1 and events[0].status == "RESOURCE_EXHAUSTED",
              "streamed, a refusal without an id: %r" % events)
        r = c.infer("usage")
        check(r.ok and r.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                                    "cached_tokens": 0}
              and r.loop_ends == {"decode_loop": "max_iters"}, "usage: %r %r" % (r.usage,
                                                                              r.loop_ends))
        check(c.infer("conversation", messages=[("user", "x")]).usage == {}, "no usage")

        evs = list(c.stream("g", {"prompt": "one two three"}))
        check([e.is_chunk for e in evs] == [True, True, True, False], "stream order")
        check("".join(e.text for e in evs[:-1]) == "one two three", "stream text")
        check([e.seq for e in evs[:-1]] == [0, 1, 2], "stream seq")
        r = c.infer("g", {"prompt": "a b"}, stream=True)
        check(len(r.chunks) == 2 and r.text() == "a b", "infer(stream=True) keeps chunks")

        r = c.infer("missing", {})
        check(r.status == "NOT_FOUND" and not r.ok, "NOT_FOUND")
        check(raises(bc.StatusError, r.raise_for_status), "raise_for_status")

        # Two in flight: the slow one is cancelled while the echo one completes.
        slow = c.send("slow", {})
        fast = c.send("g", {"prompt": "hi"})
        a = c.cancel(slow)
        check(a.found and a.status == "OK" and a.request_id == slow, "cancel answer: %r" % (a,))
        got = {}
        while len(got) < 2:
            ev = c.recv(5000)
            if not ev.is_chunk:
                got[ev.request_id] = ev.status
        check(got == {slow: "CANCELLED", fast: "OK"}, "cancel with two in flight: %r" % got)

        a = c.cancel("nobody")
        check(not a.found and a.status == "NOT_FOUND" and "nobody" in a.message,
              "cancel of an unknown id: %r" % (a,))
        # Stop strings, max_tokens, the text output and raw inputs on the wire
        # (the fake server says back what it got), and the finish reason.
        r = c.infer("limits", {"prompt": "x"}, stop=["\n\nUser:", "END"], max_tokens=5,
                    text_output="text", raw_inputs=["prompt"])
        check(r.ok and r.message == "stop=['\\n\\nUser:', 'END'] max_tokens=5 text_output=text "
              "raw_inputs=['prompt']", "limits on the wire: %r" % r.message)
        check(r.finish_reason == "stop", "finish_reason: %r" % r.finish_reason)
        r = c.infer("limits", {"prompt": "x"}, stop="one")
        check(r.message.startswith("stop=['one'] max_tokens=0"), "one stop string: %r" % r.message)
        check(c.infer("g", {"prompt": "a"}).finish_reason is None, "no finish reason")

        check(raises(bc.Timeout, lambda: c.infer("slow", {}, wait_ms=200)), "timeout")
        check(raises(bc.ProtocolError, lambda: c.infer("garbage", {}, wait_ms=2000)),
              "malformed frame")
        check(c.health().ready, "still usable after errors")
        check(c.wait_ms == bc.DEFAULT_WAIT_MS and bc.DEFAULT_WAIT_MS > 0, "default wait_ms")

    # A call that sets no bound of its own waits the client's wait_ms, then
    # raises Timeout: a daemon that never answers does not hold it for ever.
    with bc.Client(ep, wait_ms=300) as c:
        check(raises(bc.Timeout, lambda: c.infer("slow", {})), "infer past the client's wait_ms")
        check(raises(bc.Timeout, lambda: list(c.stream("slow", {}))),
              "stream past the client's wait_ms")
        check(raises(bc.Timeout, c.recv), "recv past the client's wait_ms")
        check(c.health().ready, "usable after the client's wait_ms ran out")

    with bc.Client("ipc:///tmp/baton-no-such-daemon.sock", connect_timeout_ms=200) as c:
        check(raises(bc.ConnectError, c.health), "no daemon: ConnectError")
    check(raises(bc.ConnectError, lambda: bc.Client("bogus://x")), "bad endpoint: ConnectError")
    check_curve_arguments()
    return 1 if failures else 0


def check_curve_arguments():
    """client_key= and server_key= as paths or keys; what is refused before
    any connection (the handshake itself is test_curve.py's)."""
    import tempfile
    import zmq
    d = tempfile.mkdtemp(prefix="baton-pyclient-keys-")
    spub, _ = zmq.curve_keypair()
    pub, sec = zmq.curve_keypair()
    key, pubf = os.path.join(d, "c.key"), os.path.join(d, "s.pub")
    with open(key, "wb") as f:
        f.write(sec + b"\n")
    os.chmod(key, 0o600)
    with open(pubf, "wb") as f:
        f.write(spub + b"\n")
    ep = "tcp://127.0.0.1:1"
    for server in (spub.decode(), spub, pubf):
        for client in (key, (pub.decode(), sec.decode()), (pub, sec), None):
            try:
                bc.Client(ep, server_key=server, client_key=client).close()
                ok = True
            except Exception as e:
                ok = False
                print("  (raised %r)" % e)
            check(ok, "server_key %r, client_key %r" % (type(server), type(client)))
    check(raises(ValueError, lambda: bc.Client(ep, client_key=key)),
          "client_key without server_key")
    check(raises(ValueError, lambda: bc.Client(ep, server_key=key, client_key=key)),
          "a .key file as server_key")
    check(raises(ValueError, lambda: bc.Client(ep, server_key=spub, client_key=(pub, b"x"))),
          "a short secret key")
    os.chmod(key, 0o640)
    check(raises(ValueError, lambda: bc.Client(ep, server_key=spub, client_key=key)),
          "a group-readable secret key file")
    for f in (key, pubf):
        os.unlink(f)
    os.rmdir(d)


if __name__ == "__main__":
    sys.exit(main())
