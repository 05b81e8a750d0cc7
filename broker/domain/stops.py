"""Stops (Ctrl-C, SIGTERM, SIGHUP) held through work that one must not cut short, then let act.

- **A child process starting.** `subprocess.Popen` forks, execs, then waits for the exec to succeed. A stop in that
  wait raises out of it with the child running and nobody holding it to stop: under load a SIGTERM'd backtest left
  its scratch redis-server running (1 of 60 tries with four CPU burners beside it). The scratch servers
  (store/embedded.py), the local agents (agents/provision.py) and the bubble demo's training start under it.
- **A HiGHS solve.** A signal's Python handler runs only between Python steps, and a solve is one long C++ call: a
  SIGTERM in a backtest's bounds waited out the solve's time limit (5 s a job, 60 s the joint bound). Held, the stop
  is seen by HiGHS's interrupt callbacks, which run Python, and they end the solve (planning/highs.py).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stops_held() -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then are raised again for the handlers they had. Yields
    the stops held so far (it fills as they come), for work that can end early. Only the main thread runs Python's
    signal handlers (and may change them): elsewhere the block runs as it is, and the list stays empty."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    # a handler installed outside Python (None here) could not be put back: such a stop is left as it is
    held_ones = [s for s in STOPS if signal.getsignal(s) is not None]
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in held_ones}
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])  # the handler it had now runs (a KeyboardInterrupt, say) from here
