"""How long a fill task's next step may take: a step starts only where it would still end inside its window, so the
main job is not slowed (the child in bubbles/executor.py asks before each step).

It is the longest step timed so far (the profiled time is its floor). One slow step (a spike of the machine's load, a
page fault) then fitted no window after it: no step ran again to show it was a spike, and the fill job made no
progress on its stage for good (a loaded machine's fresh clone saw a job stay at step 3 for two minutes). After
STALLED_WINDOWS windows in a row without a step, the task tries again at its usual step time (the median of its last
steps): a step that is really that long is timed again and keeps it out for as many windows more.

A new process's first whole step (its warm-up: a GPU's first kernels) is its slowest, and it is not what the warm steps
are planned with. After a kill, each new process ran that step again in the next window, overran it and was killed
again, for as long as the windows were shorter than the warm-up: a restart (seconds) a window, and no progress. A
process started after a kill plans its warm-up with the longest warm-up its executor saw (bubbles/executor.py), and
tries it again after STALLED_WINDOWS windows too short for it: one kill in so many windows at most.
"""

from __future__ import annotations

from collections import deque
from statistics import median

STALLED_WINDOWS = 16  # a second of bubbles at a 60 ms iteration, a minute at a few seconds
USUAL_STEPS = 16


class StepTime:
    """The time a step is planned with: the longest timed, until the steps stall."""

    def __init__(self, planned_s: float, usual_s: list[float] | tuple = (), warm_up_s: float = 0.0):
        self.seconds = planned_s  # profiled (after a kill: the longest seen), until steps are timed here
        self.usual = deque(usual_s, maxlen=USUAL_STEPS)  # the last steps' times (a restarted process is given them)
        self.warm_up_s = warm_up_s  # a call of the process's first whole step (after a kill: the longest seen)
        self.stalled = 0  # windows in a row without a step

    def next_s(self, warming_up: bool) -> float:
        """The time the next call is planned with: during the warm-up, at least the warm-up's."""
        return max(self.seconds, self.warm_up_s) if warming_up else self.seconds

    def timed(self, seconds: float) -> None:
        """A step took `seconds` (a warm-up's is not planned with: not given)."""
        self.seconds = max(self.seconds, seconds) if self.seconds else seconds
        self.usual.append(seconds)

    def window_ended(self, steps: int) -> None:
        """A window ended with `steps` steps run in it."""
        self.stalled = 0 if steps else self.stalled + 1
        if self.stalled >= STALLED_WINDOWS and self.warm_up_s:  # the warm-up's time may have been a spike's
            self.warm_up_s, self.stalled = 0.0, 0
        elif self.stalled >= STALLED_WINDOWS and self.usual:
            self.seconds, self.stalled = median(self.usual), 0
