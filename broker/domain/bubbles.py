"""Bubble profiles as data: what a running pipeline's stages measured of their idle windows, and what their fill
executors made of them. The profiler builds them, the store keeps them, capacity turns them into Offers."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

DRIFT = 0.10
FORECAST = "forecast"  # the device of a profile from the model, before any measurement


def stage_agent_id(main_job: str, stage: int) -> str:
    """The agent id of a main job's pipeline stage, and its bubble offer's zone: the stages are a pool named after the
    main job, "<main job>.stage<n>", so one pool token admits them all (agents/tokens.py)."""
    return f"{main_job}.stage{stage}"


class WindowStats(BaseModel):
    kind: str
    offset_s: float = 0.0  # median start within the iteration
    median_s: float
    p10_s: float
    free_bytes: int  # the least free memory seen at this window's start
    count: int


class BubbleProfile(BaseModel):
    """One stage of a main training job: its iteration period and idle windows."""

    main_job: str
    stage: int
    device: str  # e.g. "cuda:0 H100" or "cpu"
    iteration_s: float
    windows: list[WindowStats]
    measured_at: datetime

    def bubble_fraction(self) -> float:
        """Share of the iteration this stage is idle in its recorded windows (medians)."""
        return sum(w.median_s for w in self.windows) / self.iteration_s

    def usable_s(self, min_window_s: float = 0.0) -> float:
        """Idle seconds per iteration in windows that are nearly always (p10) at least min_window_s long."""
        return sum(w.p10_s for w in self.windows if w.p10_s >= min_window_s)

    def drifted(self, iteration_s: float) -> bool:
        """Whether the main job's iteration time moved more than 10% since this profile."""
        return abs(iteration_s - self.iteration_s) > DRIFT * self.iteration_s


class FillStats(BaseModel):
    """What a stage's fill executor made of its bubbles while it served fill jobs (for the dashboard)."""

    main_job: str
    stage: int
    bubble_s: float = 0.0  # idle time of the windows that came while it held a fill job (profile medians)
    fill_s: float = 0.0  # time its fill steps ran
    iteration_s: float | None = None  # the main job's median iteration time meanwhile
    jobs: int = 0  # fill jobs served
    missed: int = 0  # usable windows gone before the agent was free for them (their time counts in bubble_s)
    updated_at: datetime

    def fill_share(self) -> float | None:
        return self.fill_s / self.bubble_s if self.bubble_s > 0 else None

    def slowdown(self, profile: BubbleProfile) -> float | None:
        """The main job's iteration time with fill over its time in the profile (measured without), less 1."""
        return None if self.iteration_s is None else self.iteration_s / profile.iteration_s - 1
