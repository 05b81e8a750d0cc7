"""HiGHS solves that a stop ends early (domain/stops.py): a SIGTERM to `broker backtest` or `broker server` waited
out the solve's time limit (up to a minute), since a signal's Python handler runs only between Python steps.

Under `stops_held` a stop is only noted; HiGHS calls these interrupt callbacks every few milliseconds of a solve, the
note is seen there, the solve ends (interrupted), and the stop then acts as it would have.
"""

from __future__ import annotations

import highspy
import pulp

from broker.domain.stops import stops_held

_INTERRUPTS = (
    highspy.cb.HighsCallbackType.kCallbackSimplexInterrupt,
    highspy.cb.HighsCallbackType.kCallbackIpmInterrupt,
    highspy.cb.HighsCallbackType.kCallbackMipInterrupt,
)


def _interrupt_once_held(held: list[int]):
    def callback(_kind, _message, _data_out, data_in, _user_data) -> None:
        if held and data_in is not None:
            data_in.user_interrupt = True

    return callback


def solve(prob: pulp.LpProblem, **options) -> None:
    """`prob.solve` with a quiet HiGHS (`options`: pulp.HiGHS's, timeLimit say) that a stop ends early."""
    with stops_held() as held:
        callbacks = {"callbackTuple": (_interrupt_once_held(held), None), "callbacksToActivate": list(_INTERRUPTS)}
        prob.solve(pulp.HiGHS(msg=False, **options, **callbacks))


def run(highs: highspy.Highs) -> None:
    """`highs.run()` that a stop ends early."""
    with stops_held() as held:
        highs.setCallback(_interrupt_once_held(held), None)
        for kind in _INTERRUPTS:
            highs.startCallback(kind)
        highs.run()
