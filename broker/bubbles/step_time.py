"""How long a fill task's next step may take: a step starts only where it would still end inside its window, so the
main job is not slowed (the child in bubbles/executor.py asks before each step).

It is the longest step of the last RECENT_WINDOWS windows. It was the longest step ever seen, and one slow step (a
spike of the machine's load, a page fault) then fitted no window after it: no step ran again to show it was a spike,
and the fill job made no progress on its stage for good (a loaded machine's fresh clone saw a job stay at step 3 for
two minutes). Windows without a step age it out: after RECENT_WINDOWS of them the task tries at its usual step time
(the median of its last steps), and a step that is really that long is timed again and keeps it out.
"""

from __future__ import annotations

from collections import deque
from statistics import median

RECENT_WINDOWS = 16  # a second of bubbles at a 60 ms iteration, a minute at a few seconds
USUAL_STEPS = 16


class StepTime:
    """The time a step is planned with, from the steps timed in the last windows."""

    def __init__(self, planned_s: float, usual_s: list[float] | tuple = ()):
        self.planned_s = planned_s  # profiled (after a kill: the longest seen): until steps are timed here
        self.windows: deque[list[float]] = deque(maxlen=RECENT_WINDOWS)
        self.usual = deque(usual_s, maxlen=USUAL_STEPS)  # the last steps' times (a restarted process is given them)

    def next_window(self) -> None:
        """A window begins: the oldest one's steps are forgotten."""
        self.windows.append([])

    def timed(self, seconds: float) -> None:
        """A step of this window took `seconds` (a warm-up's is not planned with: not given)."""
        self.windows[-1].append(seconds)
        self.usual.append(seconds)

    @property
    def seconds(self) -> float:
        recent = [s for steps in self.windows for s in steps]
        if recent:
            return max(recent)
        if len(self.windows) == RECENT_WINDOWS and self.usual:  # a whole memory of windows without a step
            return median(self.usual)
        return self.planned_s
