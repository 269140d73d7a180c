"""Time limits inside the Python tests, scaled as tests/limits.sh scales
the limits of whole test programs: by $BATON_TEST_TIMEOUT_SCALE (default
1; raise it on a slow or loaded machine) and three times more in a
sanitizer build ($BATON_TEST_SAN=1, set by `make asan-test`).

For waits whose length is the machine's speed, not a promise of baton's:
a client that waits for a hundred streams computed before its own."""
import os


def scale():
    try:
        s = float(os.environ.get("BATON_TEST_TIMEOUT_SCALE", "1"))
    except ValueError:
        s = 1.0
    if s <= 0:
        s = 1.0
    return s * (3 if os.environ.get("BATON_TEST_SAN") == "1" else 1)


def test_limit(seconds):
    """SECONDS scaled, at least 1."""
    return max(1.0, seconds * scale())
