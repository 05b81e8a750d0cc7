"""Child processes that a stop must not orphan: the scratch redis-servers (store/embedded.py) and the local agents
(agents/provision.py).

`subprocess.Popen` forks, execs, then waits for the exec to succeed. A SIGTERM or Ctrl-C in that wait (or before the
caller keeps the Popen) raises out of it with the child already running and nobody holding it to stop: under load a
SIGTERM'd backtest left its scratch redis-server running (1 of 60 tries with four CPU burners beside it).
`stops_held` holds such a stop until the child is kept, then lets it act as it would have.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stops_held():
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then are raised again for the handlers they had. Only
    the main thread runs Python's signal handlers (and may change them): elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in STOPS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])  # the handler it had now runs (a KeyboardInterrupt, say) from here
