"""The folders of test daemons, kept as evidence when a check fails.

The integration and emulator tests (tests/integration/*.py,
tests/cudaemu/*.py) run batond and its workers in a folder of their own:
the deployment file, the sockets and batond.log, where the spawned
workers' output goes too.  new_dir() makes such a folder: under
$BATON_TEST_LOGDIR when the test runner set it (tests/run-limited.py makes
one per script, /tmp/baton-test-SUITE-SCRIPT-XXXXXX, and removes it when
the script passes), else in /tmp as baton-test-SCRIPT-XXXXXX.  Every
folder a test leaves is therefore /tmp/baton-test-*.

A script says how each check went:
  passed()      the check passed: the folders released since (release(),
                called where a daemon is stopped) are removed;
  failed(name)  it failed: every folder not yet removed is kept, and named
                ("evidence kept: PATH") with the last lines of its logs.
At exit the folders not kept are removed, unless the script ends by an
exception it did not catch or by SIGTERM: then every folder is kept and
named.  Importing this module turns SIGTERM (what the runner sends a script
that ran out of time) into a SystemExit raised in the main thread, so that
the `finally:` blocks stop the daemons and their logs are shown.
"""
import atexit
import os
import shutil
import signal
import sys
import tempfile

TAIL_LINES = 60

_folders = {}     # path -> "open", "released" or "kept", in order of making
_scratch = []     # folders removed at exit whatever happened
_abnormal = None  # why the script is ending badly, once known
_script = os.path.splitext(os.path.basename(sys.argv[0] or "test"))[0]
if _script.startswith("test_"):
    _script = _script[5:]


class Terminated(SystemExit):
    """SIGTERM arrived: the runner's time limit, or someone stopping the test."""


def _on_sigterm(signum, _frame):
    global _abnormal
    _abnormal = "SIGTERM"
    raise Terminated(128 + signum)


def _parent():
    return os.environ.get("BATON_TEST_LOGDIR") or tempfile.gettempdir()


def _prefix(tag):
    tag = tag or _script
    return "%s-" % tag if os.environ.get("BATON_TEST_LOGDIR") else "baton-test-%s-" % tag


def new_dir(tag=None):
    """A new folder for a daemon's files, named after TAG (default: the
    script's name); kept when a check fails while it exists."""
    path = tempfile.mkdtemp(prefix=_prefix(tag), dir=_parent())
    _folders[path] = "open"
    return path


def scratch_dir(tag=None):
    """A new folder for files that are no evidence (generated code):
    removed at exit in any case."""
    path = tempfile.mkdtemp(prefix=_prefix(tag), dir=_parent())
    _scratch.append(path)
    return path


def release(path):
    """PATH's daemon has stopped: the folder goes when the check passes."""
    if _folders.get(path) == "open":
        _folders[path] = "released"


def passed():
    """The check that just ended passed."""
    for path, state in list(_folders.items()):
        if state == "released":
            shutil.rmtree(path, ignore_errors=True)
            del _folders[path]


def failed(name=None):
    """The check NAME just failed: every folder still there is kept and
    shown."""
    for path in _folders:
        _folders[path] = "kept"
    _show(name)


def logs(path):
    """The log files in folder PATH (and below), sorted."""
    found = []
    for top, _, files in os.walk(path):
        found += [os.path.join(top, f) for f in files if f.endswith(".log") or f == "log"]
    return sorted(found)


def tail(path, lines=TAIL_LINES):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return "(cannot read %s: %s)\n" % (path, e)
    return "".join("    %s\n" % line for line in text.splitlines()[-lines:])


def _show(why):
    out = []
    for path in _folders:
        if not os.path.isdir(path):
            continue
        out.append("evidence kept: %s%s\n" % (path, " (%s)" % why if why else ""))
        for log in logs(path):
            out.append("--- last %d lines of %s\n%s" % (TAIL_LINES, log, tail(log)))
    sys.stdout.write("".join(out))
    sys.stdout.flush()


def _excepthook(kind, value, tb):
    global _abnormal
    _abnormal = _abnormal or kind.__name__
    _previous_hook(kind, value, tb)


def _at_exit():
    if _abnormal:
        for path in _folders:
            _folders[path] = "kept"
        _show("the script ended by %s" % _abnormal)
    else:
        for path, state in list(_folders.items()):
            if state != "kept":
                shutil.rmtree(path, ignore_errors=True)
                del _folders[path]
    for path in _scratch:
        shutil.rmtree(path, ignore_errors=True)


_previous_hook = sys.excepthook
sys.excepthook = _excepthook
atexit.register(_at_exit)
signal.signal(signal.SIGTERM, _on_sigterm)
