"""Which configuration a fill job runs in a stage's bubbles: the choosing half of PipeFill's Algorithm 1, live.

The fill agent times each configuration the task offers (FillTask.configurations, the one it was submitted
with first) in the stage's real windows, a few windows each. A configuration's step becomes nodes for
`best_configuration`: as many as it has micro-steps, each of the median micro-step time and the task's peak
memory, packed into the windows' usable lengths and free memory. A configuration killed twice for overrunning
its windows, or holding more memory than any window has free, is out. One that ran too few steps to time (a
slow first step keeps the executor out of shorter windows) is not judged: if nothing better is known the job
runs on as submitted; only when every configuration is out does the job leave. `after_window` drives the
executor through the trials; the agent (and bench/fill_configurations.py) call it after each window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.bubbles.fill_plan import Node, best_configuration, fill_throughput

AS_SUBMITTED = "as submitted"
PROBE_STEPS = 8  # micro-steps timed per configuration
PROBE_WINDOWS = 12  # windows a configuration gets to time them in (a step longer than the windows runs in none)
KILLS_OUT = 2  # kills while timed: its steps do not end inside the windows
MIN_TIMED = 3  # steps a configuration's time is taken from (their median)


@dataclass
class Trial:
    """One configuration as timed in the windows."""

    name: str
    overrides: dict
    micro_steps: int = 1
    step_s: list[float] = field(default_factory=list)
    windows: int = 0
    kills: int = 0
    peak_bytes: int = 0

    def timed(self) -> bool:
        return len(self.step_s) >= PROBE_STEPS or self.windows >= PROBE_WINDOWS or self.kills >= KILLS_OUT

    def nodes(self) -> list[Node] | None:
        """One step of the work as nodes; None when it overran its windows or ran too few steps to time."""
        if self.kills >= KILLS_OUT or len(self.step_s) < MIN_TIMED:
            return None
        times = sorted(self.step_s)
        return [Node(times[len(times) // 2], self.peak_bytes)] * self.micro_steps

    def out(self, bubbles: list[tuple[float, int]], iteration_s: float) -> bool:
        """Known not to fit these windows: killed in them, over their free memory, or timed and fitting none."""
        if self.kills >= KILLS_OUT or self.peak_bytes > max(free for _, free in bubbles):
            return True
        nodes = self.nodes()
        return nodes is not None and fill_throughput(bubbles, iteration_s, nodes) == 0.0

    def step_time_s(self) -> float | None:
        """A whole step's exclusive time (its micro-steps together)."""
        nodes = self.nodes()
        return sum(n.time_s for n in nodes) if nodes else None


TIMING, NEXT, CHOSEN, UNFIT = "timing", "next", "chosen", "unfit"  # after_window's outcomes


class ConfigurationProbe:
    """The trials of one fill job on one stage, in order; the current one is being timed."""

    def __init__(self, configurations: dict[str, dict], micro_steps: int):
        first = Trial(AS_SUBMITTED, {}, micro_steps)
        self.trials = [first] + [Trial(name, dict(overrides)) for name, overrides in configurations.items()]
        self.at = 0
        self.chosen: Trial | None = None  # once every trial is timed

    @property
    def trial(self) -> Trial:
        return self.trials[self.at]

    def record(self, report: dict | None, micro_steps: int, peak_bytes: int) -> None:
        """One window of the current trial: its executor report (None when the task was killed)."""
        trial = self.trial
        trial.windows += 1
        trial.micro_steps, trial.peak_bytes = micro_steps, max(trial.peak_bytes, peak_bytes)
        if report is None:
            trial.kills += 1
        else:
            trial.step_s += [end - start for start, end in report["steps"]]

    def advance(self) -> Trial | None:
        """The next configuration to time, or None when every one has been."""
        self.at += 1
        return self.trial if self.at < len(self.trials) else None

    def choice(self, bubbles: list[tuple[float, int]], iteration_s: float) -> Trial | None:
        """The configuration that does the most work in these (length, free bytes) windows; the submitted one when
        none is known to fit and it is not known not to; None when the job cannot run here."""
        scored = {t.name: t.nodes() for t in self.trials}
        best = best_configuration(bubbles, iteration_s, {name: nodes for name, nodes in scored.items() if nodes})
        if best:
            return next(t for t in self.trials if t.name == best[0])
        return None if self.trials[0].out(bubbles, iteration_s) else self.trials[0]

    def efficiency(self, chosen: Trial) -> float:
        """Work per second of the chosen configuration's steps over the submitted one's (1 when either is
        unknown): the bubble offer's speed is a share of the job's speed as submitted, which quotes assume."""
        own, theirs = self.trials[0].step_time_s(), chosen.step_time_s()
        return own / theirs if own and theirs else 1.0

    def after_window(self, executor, report: dict | None, bubbles: list[tuple[float, int]], iteration_s: float) -> str:
        """Record the window the executor just ran; switch it to the next trial (NEXT) or, once all are timed, to
        the chosen configuration from the state before the trials (CHOSEN: see `chosen`); UNFIT if none fits;
        TIMING while the current trial goes on."""
        self.record(report, executor.micro_steps, executor.peak_bytes)
        if not self.trial.timed():
            return TIMING
        following = self.advance()
        if following is not None:
            executor.reconfigure(following.overrides, trial=True)
            return NEXT
        self.chosen = self.choice(bubbles, iteration_s)
        if self.chosen is None:
            return UNFIT
        if len(self.trials) > 1:  # a trial runs now
            executor.reconfigure(self.chosen.overrides)
        return CHOSEN
