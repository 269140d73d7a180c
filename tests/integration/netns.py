"""Hosts made of Linux network namespaces, for tests of multi-host baton.

Each "host" is a network namespace with its own veth link to a bridge that
lives in a hub namespace of its own, and one IPv4 address on a private
subnet chosen per run.  Nothing is attached to the machine's own network
namespace: traffic goes only between the namespaces' addresses.

The namespaces share everything else with the machine (the file system,
/dev/shm, the hostname), so a deployment run in them declares each
worker's host with the YAML `host:` key; the network between them is real
(veth, TCP, a link that can be cut).

Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
`available()` says whether this machine allows it and, if not, why; a
test that cannot run prints SKIP with that reason.
"""
import os
import random
import subprocess


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, check=check)


def available():
    """(True, "") when namespaces can be made here, else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (run as root, as CI does)"
    if subprocess.run(["which", "ip"], capture_output=True).returncode != 0:
        return False, "the `ip` command (iproute2) is missing"
    name = "btprobe%d" % os.getpid()
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return False, "`ip netns add` failed: %s" % r.stderr.strip()
    _ip("netns", "del", name, check=False)
    return True, ""


class Hosts:
    """N hosts named NAMES, each a namespace with one address.

    with Hosts(["c", "w1", "w2"]) as h:
        h.addr("w1")                      # "10.213.17.2"
        h.popen("w1", [...])              # a process inside w1's namespace
        h.link("w1", up=False)            # cut w1 off the bridge
    """

    def __init__(self, names):
        self.names = list(names)
        self.tag = "bt%d" % os.getpid()
        # A /24 per run so that concurrent runs do not share addresses.
        self.net = "10.%d.%d" % (random.randint(200, 250), random.randint(0, 255))
        self.hub = self.tag + "hub"
        self.procs = []
        self._made = []

    def ns(self, name):
        return "%s-%s" % (self.tag, name)

    def addr(self, name):
        return "%s.%d" % (self.net, self.names.index(name) + 1)

    def dev(self, name):
        return "v%d" % self.names.index(name)

    def __enter__(self):
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _netns_add(self, ns):
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _make(self):
        self._netns_add(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.ns(name)
            self._netns_add(ns)
            _ip("link", "add", self.dev(name), "netns", ns, "type", "veth",
                "peer", "name", "h%d" % i, "netns", self.hub)
            _ip("-n", self.hub, "link", "set", "h%d" % i, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", self.addr(name) + "/24", "dev", self.dev(name))
            _ip("-n", ns, "link", "set", self.dev(name), "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def cmd(self, name, argv):
        """ARGV run inside NAME's namespace."""
        return ["ip", "netns", "exec", self.ns(name)] + list(argv)

    def popen(self, name, argv, **kw):
        p = subprocess.Popen(self.cmd(name, argv), **kw)
        self.procs.append(p)
        return p

    def link(self, name, up):
        """Brings NAME's link up or down (a cable pulled and put back)."""
        _ip("-n", self.ns(name), "link", "set", self.dev(name), "up" if up else "down")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        # Deleting a namespace deletes its veth end, and with it the peer.
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []


def enter(hosts, name):
    """Moves the calling thread into NAME's namespace (setns).

    Call it before creating any thread or ZeroMQ context: threads made
    afterwards (ZeroMQ's I/O threads among them) are born in it too, so the
    test's own clients then connect from that host."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNET = 0x40000000
    fd = os.open("/run/netns/" + hosts.ns(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns into %s: %s" % (hosts.ns(name), os.strerror(e)))
    finally:
        os.close(fd)
