"""The deadline guard: Uniform Progress between rounds, and the moves the policy's rule makes off on-demand or to a
cheaper zone, as the quote's forecast (models/futures.py) plays that rule. A move is a request on the job (checkpoint,
hand it back, pinned to a tier or not), written by the leading replica only; the agent learns of it from its view.
A job goes back from on-demand only to spot that no pending job fits: the planner gives a waiting job the idle agent
first, and the job handed back would go to on-demand again, a changeover and a checkpoint for nothing (a lost
deadline run cheapest so yields to the jobs that can still make theirs); with no spot free, a rule that waits for it
(policy.leaves_on_demand_to_wait: Uniform Progress past ep(t + 2d)) hands the job back to the queue. A job on spot
near the safety net that a preemption would put past it is asked for a checkpoint, and runs on
(uniform_progress.checkpoint_due); on spot, and for a start there, the net keeps one pass of the guard more
(Progress.pass_h).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from broker.domain.model import AgentInfo, Job, Tier
from broker.domain.offer import Offer
from broker.models.fit import fit_key, fits
from broker.models.risk import as_fast, checkpoint_hours, notice_loss_h
from broker.planning.option_table import PlanItem, work_unsaved
from broker.planning.uniform_progress import Move, checkpoint_due, decide, progress_of
from broker.store.jobs import Store

log = logging.getLogger(__name__)
PENDING_READ = 1000  # pending jobs a lost deadline's job yields spot to, at most (the server plans as many a round)


class DeadlineGuard:
    """One pass of the guard over the active jobs, for the replica `leader` that holds the planning lease."""

    def __init__(self, store: Store, policy, leader: str):
        self.store, self.policy, self.leader = store, policy, leader
        self._waits_for_spot = getattr(policy, "leaves_on_demand_to_wait", None)  # a rule that waits off on-demand
        self._wanted_ids: set[str] | None = None

    def moves(
        self, now: datetime, idle: list[AgentInfo], pass_h: float = 0.0, active: list[Job] | None = None
    ) -> list[str]:
        """A spot or bubble job falling behind its deadline is asked to checkpoint and move to on-demand now; under
        a rule that leaves on-demand (Uniform Progress once far enough ahead, ep(t + 2d); hedge when spot is worth
        its changeovers) a job on on-demand is asked back to spot when one of the `idle` agents fits it and no
        pending job does, or, with none to go to, back to the queue where the rule waits for spot
        (leaves_on_demand_to_wait); a job on spot that a preemption before the next pass (in `pass_h`) would put past
        the safety net is asked for a checkpoint, and one within a pass of the net goes to on-demand. Returns the ids
        of the jobs it moved. `active`: the jobs with a run under way, when read already (else read here)."""
        moved = []  # the idle agents to go to: bubbles (free) first, then the cheapest spot
        spot_idle = sorted((a for a in idle if a.offer.tier != Tier.on_demand), key=lambda a: a.offer.price_usd_per_h)
        for job in self.store.active_jobs() if active is None else active:
            run, baseline = job.current_run, job.quote.on_demand_baseline
            if (
                run is None
                or job.state.terminal  # cancelled (or stopped) while its run goes on: its agent is stopping it
                or run.started_at is None
                or job.spec.deadline is None
                or baseline is None
                or job.move_requested
            ):
                continue
            if run.offer.tier == Tier.on_demand and not (spot_idle or self._waits_for_spot):
                continue  # nowhere to go back to, nor a rule that waits for spot: skip the planner's view of it
            item = PlanItem.from_job(job)  # its work on on-demand at the speed it has shown
            progress = replace(progress_of(item, item.on_demand_h, job.submitted_at, now), pass_h=pass_h)
            decided = self._move(item, progress, run.offer, job.quote.chosen.offer, spot_idle, now)
            if decided is None:
                self._ask_checkpoint(job, progress, now)
                continue
            pin, spot_agent, because = decided
            left_h, window_h = progress.total_h - progress.done_h, progress.window_h - progress.elapsed_h
            until = "its second window ends" if progress.extended else "deadline"  # if_late: extend, its deadline lost
            why = f"deadline guard: {left_h:.1f} h of work left, {until} in {window_h:.1f} h{because}"

            def request(current: Job, fence=job.fence, why=why, pin=pin) -> Job | None:
                if current.fence != fence or current.current_run is None or current.move_requested:
                    return None
                return current.model_copy(
                    update={"move_requested": True, "pinned_tier": pin, "reason": why, "updated_at": now}
                )

            if self.store.update_job(job.id, request, leader=self.leader) is not None:
                log.info("job=%s guard=%s %s", job.id, "spot" if spot_agent else "on_demand", why)
                moved.append(job.id)
                if spot_agent:
                    spot_idle.remove(spot_agent)  # one job per idle spot agent: the others would only wait
        return moved

    def _ask_checkpoint(self, job: Job, progress, now: datetime) -> None:
        """Ask the agent of a job on spot or in a bubble for a checkpoint now, when a preemption would cost the job
        its deadline's margin (one request at a time; the run's next checkpoint report settles it)."""
        run = job.current_run
        if run.offer.tier == Tier.on_demand or run.checkpoint_requested_at is not None:
            return
        unsaved_h = work_unsaved(job) * progress.total_h
        if not checkpoint_due(progress, unsaved_h, checkpoint_hours(job.spec), notice_loss_h(job.spec, run.offer)):
            return

        def request(current: Job, fence=job.fence) -> Job | None:
            latest = current.current_run
            if current.fence != fence or latest is None or latest.checkpoint_requested_at is not None:
                return None
            latest = latest.model_copy(update={"checkpoint_requested_at": now})
            return current.model_copy(update={"runs": [*current.runs[:-1], latest], "updated_at": now})

        if self.store.update_job(job.id, request, leader=self.leader) is not None:
            log.info("job=%s guard=checkpoint %.2f h of work unsaved", job.id, unsaved_h)

    def _move(self, item: PlanItem, progress, on: Offer, planned: Offer, spot_idle: list[AgentInfo], now: datetime):
        """(pinned tier, the idle spot agent it goes to, why) for a job the guard moves now, else None: off spot to
        on-demand at the safety net; by the policy's rule off on-demand, or from spot to a cheaper zone. It goes
        back from on-demand only where it runs at least as fast as on the offer it was `planned` on, and to a
        cheaper zone only where it keeps the pace it has (a cheaper hour on slower GPUs may cost more work and
        the deadline)."""
        if on.tier != Tier.on_demand and decide(progress, on.tier, spot_available=True) == Move.on_demand:
            return Tier.on_demand, None, ""
        if on.tier == Tier.on_demand:
            because = f"; back to spot ({self.policy.name}'s rule)"
            if progress.runs_cheapest(on.tier):
                because = (
                    f"; the deadline is lost: back to spot no waiting job needs (if_late: {item.spec.if_late.value})"
                )
            agent = self._return_to(item, progress, on, planned, spot_idle, now)
            if agent:
                return None, agent, because
            if self._waits_for_spot and self._waits_for_spot(item, progress, now):
                return (
                    None,
                    None,
                    f"; ahead of its pace, no spot free: queued to wait for spot ({self.policy.name}'s rule)",
                )
        elif on.tier == Tier.spot:
            zones = [a for a in spot_idle if a.offer.tier == Tier.spot and a.may_take(item.id)]
            agent = _cheapest_idle(item, zones, as_fast_as=on)
            if agent and self.policy.moves_zone(item, progress, on, agent.offer):
                where = agent.offer.zone or agent.offer.region
                return None, agent, f"; to a cheaper zone, {where} ({self.policy.name}'s rule)"
        return None

    def _return_to(self, item: PlanItem, progress, on: Offer, planned: Offer, spot_idle: list[AgentInfo], now):
        """The cheapest idle spot agent no pending job fits, if the policy's rule leaves on-demand for it (a waiting
        job would take it first: on-demand again, a changeover lost). The pending jobs are read only once some
        agent would do, not on every pass that sees idle spot."""
        candidates = [
            a
            for a in spot_idle
            if a.may_take(item.id) and fits(item.spec, a.offer) and as_fast(item.spec, a.offer, planned)
        ]

        def leaves(agent: AgentInfo) -> bool:
            return self.policy.leaves_on_demand(item, progress, agent.offer, on, now)

        first = next((a for a in candidates if leaves(a)), None)
        if first is None:
            return None
        wanted = self._wanted(spot_idle)
        agent = next((a for a in candidates if a.id not in wanted), None)
        return agent if agent is first or (agent and leaves(agent)) else None

    def _wanted(self, idle: list[AgentInfo]) -> set[str]:
        """The idle agents some pending job fits and may take (pending jobs read once a pass, when a return first
        asks; one spec per shape that `fits` reads; an agent started for one job is wanted by that job alone)."""
        if self._wanted_ids is None:
            pending = self.store.pending_jobs(0, PENDING_READ)
            shapes = {fit_key(job.spec): job.spec for job in pending}
            waiting = {job.id for job in pending}
            self._wanted_ids = {
                a.id
                for a in idle
                if a.for_job in waiting or (a.for_job is None and any(fits(spec, a.offer) for spec in shapes.values()))
            }
        return self._wanted_ids


def _cheapest_idle(item: PlanItem, idle: list[AgentInfo], as_fast_as: Offer) -> AgentInfo | None:
    """The first `idle` agent (they come cheapest first) that fits the job and runs it as fast as `as_fast_as`."""
    return next((a for a in idle if fits(item.spec, a.offer) and as_fast(item.spec, a.offer, as_fast_as)), None)
