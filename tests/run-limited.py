#!/usr/bin/python3
"""Runs one test program under a time limit, for the test runners
(tests/run-unit.sh, tests/integration/run.sh, tests/cudaemu/run.sh, through
run_limited in tests/limits.sh).

    run-limited.py --limit S --name NAME --output FILE [--quiet] [--grace S]
                   [--evidence PREFIX] -- CMD ARGS...

CMD runs in a process group of its own, with stdin /dev/null and stdout and
stderr into FILE: a file, not a pipe, so that a stray process which keeps
the descriptor open cannot hold the runner up.  Without --quiet, what CMD
writes there is copied to this program's stdout as it comes, so a slow test
shows where it is.

This process makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER):
whatever CMD starts stays a descendant of it, even a daemon in a session of
its own whose parent died, so that everything can be found and stopped.

Past the limit it prints "TIMEOUT NAME: ...", sends CMD SIGTERM (the Python
tests turn it into an exception, so that their cleanup stops their daemons
and keeps their evidence), waits up to --grace seconds for CMD to end, then
sends SIGTERM to every process CMD left and to its process group, and
SIGKILL to what is still there 3 s later; it exits 124.  When CMD ends in
time, processes it left running are named and stopped the same way (the
test's own status stands).  SIGINT, SIGTERM or SIGHUP to this program stop
CMD the same way (with 5 s of grace), and then it dies of that signal
itself, so that the shell running it stops too.

--evidence PREFIX: a folder made with that name prefix (under
$BATON_TEST_TMPDIR, default /tmp) is given to CMD as $BATON_TEST_LOGDIR, the
place where the tests' helpers (tests/integration/evidence.py) make their
folders.  It is removed when CMD passes (exit 0) or skips (exit 77).  When
CMD fails or runs out of time it is kept (when not empty) and named, with
the last --tail-lines lines of every log in it (*.log): on a timeout all of
them but those the test showed itself after the limit (a test that shows a
folder's logs prints "evidence kept: PATH"); on a failure those the test
did not show at all.

Exit status: CMD's, except that a 124 of CMD's own becomes 1 (124 always
means the limit); 124 past the limit.
"""
import argparse
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PR_SET_CHILD_SUBREAPER = 36
TIMED_OUT = 124
EVIDENCE_MARK = re.compile(r"^evidence kept: (\S+)", re.M)

stop_signal = None  # the signal that asked this program to stop, if any


def on_signal(signum, _frame):
    global stop_signal
    stop_signal = signum


def make_subreaper():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def processes():
    """{pid: (ppid, pgid, command name)} of every process visible now."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name is in parentheses and may hold spaces and ')'.
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z":
            continue  # a zombie is reaped below, not stopped
        out[int(d)] = (int(fields[1]), int(fields[2]), name)
    return out


def left_behind(root_pgid):
    """PIDs of this program's descendants and of the members of process
    group ROOT_PGID (CMD's), as {pid: name}."""
    procs = processes()
    me = os.getpid()
    children = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(me, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid == me:
            continue
        found[pid] = procs[pid][2]
        todo.extend(children.get(pid, []))
    for pid, (_, pgid, name) in procs.items():
        if pgid == root_pgid and pid != me:
            found[pid] = name
    return found


def reap(child, status):
    """Reaps every child that ended; returns CMD's exit status once known
    (STATUS until then)."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == child:
            status = os.waitstatus_to_exitcode(st)
            if status < 0:
                status = 128 - status  # killed by a signal, as a shell says it


class Copier:
    """Copies what CMD writes to its output file to our stdout."""

    def __init__(self, path, quiet):
        self.path, self.quiet, self.pos = path, quiet, 0

    def pump(self):
        if self.quiet:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return
        if data:
            self.pos += len(data)
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()


def wait_gone(pids_of, seconds, child, status, copier):
    """Waits up to SECONDS for PIDS_OF() to be empty; returns CMD's status."""
    deadline = time.monotonic() + seconds
    while True:
        status = reap(child, status)
        copier.pump()
        if not pids_of() or time.monotonic() >= deadline:
            return status
        time.sleep(0.05)


def stop_all(pgid, child, status, copier):
    """SIGTERM to everything left, then SIGKILL; returns CMD's status."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        for pid in left_behind(pgid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        status = wait_gone(lambda: left_behind(pgid), wait, child, status, copier)
    return status


def tail(path, lines):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return "(cannot read: %s)\n" % e
    out = text.splitlines()[-lines:]
    return "".join("    %s\n" % line for line in out)


def logs_under(folder):
    found = []
    for top, _, files in os.walk(folder):
        for f in sorted(files):
            if f.endswith(".log") or f == "log":
                found.append(os.path.join(top, f))
    return sorted(found)


def report_evidence(folder, output_path, since, lines):
    """Names the kept FOLDER and shows the tails of its logs, less those of
    the folders the test showed itself after byte SINCE of its output."""
    shown = set()
    try:
        with open(output_path, "rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", errors="replace")
        shown = {os.path.realpath(p) for p in EVIDENCE_MARK.findall(text)}
    except OSError:
        pass
    print("evidence kept in %s" % folder)
    for log in logs_under(folder):
        if any(os.path.realpath(log).startswith(s + os.sep) for s in shown):
            continue
        print("--- last %d lines of %s" % (lines, log))
        sys.stdout.write(tail(log, lines))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=float, required=True, help="seconds CMD may run")
    ap.add_argument("--name", required=True, help="what CMD is called in messages")
    ap.add_argument("--output", required=True, help="the file CMD's output goes to")
    ap.add_argument("--quiet", action="store_true", help="do not copy the output as it comes")
    ap.add_argument("--grace", type=float, default=20.0,
                    help="seconds CMD has to end after SIGTERM (default 20)")
    ap.add_argument("--evidence", metavar="PREFIX", help="make $BATON_TEST_LOGDIR (see above)")
    ap.add_argument("--tail-lines", type=int, default=60)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    if not make_subreaper():
        print("run-limited: cannot become a child subreaper; processes that leave their "
              "parent may escape when %s is stopped" % a.name, flush=True)

    env = dict(os.environ)
    evidence = None
    if a.evidence:
        parent = os.environ.get("BATON_TEST_TMPDIR") or "/tmp"
        evidence = tempfile.mkdtemp(prefix=a.evidence, dir=parent)
        os.chmod(evidence, 0o755)  # as /tmp's folders: daemons under other users reach it
        env["BATON_TEST_LOGDIR"] = evidence

    out = open(a.output, "wb")
    copier = Copier(a.output, a.quiet)
    try:
        # A process group of its own (setpgid; Popen's process_group needs
        # Python 3.11), still in this session.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, preexec_fn=os.setpgrp)
    except OSError as e:
        print("FAIL %s: cannot run %s: %s" % (a.name, cmd[0], e), flush=True)
        return 127
    child, pgid = proc.pid, proc.pid
    status = None
    deadline = time.monotonic() + a.limit
    timed_out = False
    shown_since = 0  # the test's own "evidence kept" lines count from here
    while status is None:
        status = reap(child, status)
        copier.pump()
        if status is not None:
            break
        if stop_signal is not None or time.monotonic() >= deadline:
            timed_out = stop_signal is None
            shown_since = os.path.getsize(a.output)
            if timed_out:
                print("TIMEOUT %s: still running after %d s, its time limit: stopping it "
                      "and every process it started (SIGTERM, SIGKILL after %d s)"
                      % (a.name, a.limit, a.grace), flush=True)
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass
            end = time.monotonic() + (a.grace if timed_out else min(a.grace, 5.0))
            while status is None and time.monotonic() < end:
                time.sleep(0.05)
                status = reap(child, status)
                copier.pump()
            status = stop_all(pgid, child, status, copier)
            break
        time.sleep(0.05)
    proc.returncode = status  # reaped here, not by Popen

    # What CMD left running: named, then stopped.
    left = left_behind(pgid)
    if left and not timed_out and stop_signal is None:
        print("NOTE %s left %d process(es) running: %s; stopping them"
              % (a.name, len(left), ", ".join("%d (%s)" % p for p in sorted(left.items()))),
              flush=True)
    if left:
        status = stop_all(pgid, child, status, copier)
    copier.pump()
    out.close()
    gone = left_behind(pgid)
    if gone:
        print("run-limited: %s: %d process(es) could not be stopped: %s"
              % (a.name, len(gone), ", ".join("%d (%s)" % p for p in sorted(gone.items()))),
              flush=True)

    if stop_signal is not None:
        rc = 128 + stop_signal
    elif timed_out:
        rc = TIMED_OUT
    else:
        rc = 1 if status == TIMED_OUT else (status if status is not None else 1)
    if evidence:
        if rc in (0, 77) or not os.listdir(evidence):
            shutil.rmtree(evidence, ignore_errors=True)
        else:
            report_evidence(evidence, a.output, shown_since, a.tail_lines)
    if stop_signal is not None:
        # Die of the signal, so that the shell running this stops too
        # (bash goes on after a child that merely exited 130).
        sys.stdout.flush()
        signal.signal(stop_signal, signal.SIG_DFL)
        os.kill(os.getpid(), stop_signal)
    return rc


if __name__ == "__main__":
    sys.exit(main())
