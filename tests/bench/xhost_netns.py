#!/usr/bin/python3
"""bench_xhost between two "hosts": network namespaces joined by a veth
pair through a bridge (tests/integration/netns.py), the producer in one
and the consumer in the other, so that the pulls and the bare ZeroMQ
floors cross the same veth link.  Run by `make bench` after the other
benchmarks; needs root (prints SKIP and exits 0 without it, as `make
bench` goes on).  It runs twice: plain, then with CURVE on every socket,
the floor's too.  The tables are bench_xhost's; the JSON goes to
BUILD/bench/bench_xhost_netns.json and bench_xhost_netns_curve.json.
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import netns  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)


def run(exe, args, curve):
    """One bench_xhost run across the namespaces; CURVE on every socket
    when CURVE."""
    env = ["env", "BATON_XHOST_CURVE=%d" % curve]
    with netns.Hosts(["a", "b"]) as h:
        pull = "tcp://%s:7301" % h.addr("a")
        floor = "tcp://%s:7302" % h.addr("a")
        prod = h.popen("a", env + ["BATON_XHOST_ROLE=producer", "BATON_XHOST_LISTEN=" + pull,
                             "BATON_XHOST_FLOOR_LISTEN=" + floor, exe] + args,
                       stdout=subprocess.DEVNULL)
        time.sleep(1.0)
        if prod.poll() is not None:
            print("bench_xhost: the producer exited with %d" % prod.returncode)
            return 1
        print("bench_xhost between two network namespaces (%s -> %s over a veth pair "
              "and a bridge)" % (h.addr("a"), h.addr("b")), flush=True)
        json = os.path.join(BUILD, "bench", "bench_xhost_netns%s.json" % ("_curve" if curve else ""))
        rc = subprocess.call(h.cmd("b", env + ["BATON_XHOST_ROLE=consumer",
                                         "BATON_XHOST_CONNECT=" + pull,
                                         "BATON_XHOST_FLOOR_CONNECT=" + floor, exe,
                                         "--json", json] + args))
        prod.terminate()
        prod.wait(timeout=10)
    return rc


def main():
    ok, why = netns.available()
    if not ok:
        print("SKIP bench_xhost in network namespaces: %s" % why)
        return 0
    exe = os.path.join(BUILD, "bench", "bench_xhost")
    args = sys.argv[1:]
    # Plain, then with CURVE on every socket (as under daemon.curve).
    return run(exe, args, False) or run(exe, args, True)


if __name__ == "__main__":
    sys.exit(main())
