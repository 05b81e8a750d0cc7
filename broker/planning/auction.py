"""Prices for capped offers by an auction (Bertsekas' auction algorithm, Jacobi form, vectorised).

The planner's program without a round budget is a transportation problem: jobs want one slot,
capped offers have a few. In each round every unplaced job bids for its best offer at current
prices (cost + price), raising that offer's price by the gap to its second-best plus epsilon;
an offer keeps its highest bids up to its capacity and its price becomes the lowest kept bid.
The prices approximate the LP's capacity duals: the planner seeds its column generation with
each job's options that are nearly best at these prices, so the LP needs few pricing passes.
Offers without a cap, and waiting (the pending penalty), never run out and cost no price.
"""

from __future__ import annotations

import numpy as np

MAX_ROUNDS = 400  # a seed, not the answer: the LP finishes the job (measured: 400 rounds ~1.3 s at 10k jobs)


def auction_prices(
    job: np.ndarray, offer: np.ndarray, cost: np.ndarray, cap: np.ndarray, penalty: np.ndarray, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """(price per offer, chosen row per job or -1 for pending) for rows (job, offer, cost)."""
    order = np.argsort(job, kind="stable")
    job, offer, cost = job[order], offer[order], cost[order]
    n_jobs = len(penalty)
    starts = np.flatnonzero(np.r_[True, job[1:] != job[:-1]])
    owners = job[starts]  # the jobs with rows, one per segment
    segment = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(job)]))
    capped = np.isfinite(cap[offer])
    price = np.zeros(len(cap))
    held_by = np.full(n_jobs, -1)  # row held (into the sorted arrays), -1 none
    bid_of = np.zeros(n_jobs)
    settled = np.zeros(n_jobs, dtype=bool)  # on an uncapped offer or pending: nobody can push it out
    for _ in range(MAX_ROUNDS):
        free = ~settled[owners] & (held_by[owners] < 0)
        if not free.any():
            break
        value = cost + price[offer]
        best = np.minimum.reduceat(value, starts)
        first = _first_at(value, best[segment], segment)
        masked = value.copy()
        masked[first] = np.inf
        second = np.minimum(np.minimum.reduceat(masked, starts), penalty[owners])
        waiting = penalty[owners] <= best
        for_job = free & ~waiting & ~capped[first]
        settled[owners[free & waiting]] = True
        settled[owners[for_job]] = True
        held_by[owners[for_job]] = first[for_job]
        bidders = free & ~waiting & capped[first]
        if not bidders.any():
            continue
        rows = first[bidders]
        bids = price[offer[rows]] + (second[bidders] - best[bidders]) + epsilon
        _award(owners[bidders], rows, bids, offer, cap, price, held_by, bid_of)
    chosen = np.where(held_by >= 0, order[np.maximum(held_by, 0)], -1)
    return price, chosen


def _first_at(value: np.ndarray, best_of_row: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """For each segment, the index of its first row whose value equals the segment's minimum."""
    hit = np.flatnonzero(value <= best_of_row)
    keep = np.r_[True, segment[hit][1:] != segment[hit][:-1]]
    return hit[keep]


def _award(jobs, rows, bids, offer, cap, price, held_by, bid_of) -> None:
    """Each offer keeps its highest bids (new and held) up to capacity; the rest lose their slot."""
    holders = np.flatnonzero(held_by >= 0)
    holders = holders[np.isin(offer[held_by[holders]], offer[rows])]
    all_jobs = np.r_[holders, jobs]
    all_rows = np.r_[held_by[holders], rows]
    all_bids = np.r_[bid_of[holders], bids]
    offers = offer[all_rows]
    ranked = np.lexsort((-all_bids, offers))
    offers, all_jobs, all_rows, all_bids = offers[ranked], all_jobs[ranked], all_rows[ranked], all_bids[ranked]
    start = np.flatnonzero(np.r_[True, offers[1:] != offers[:-1]])
    rank = np.arange(len(offers)) - np.repeat(start, np.diff(np.r_[start, len(offers)]))
    kept = rank < cap[offers]
    held_by[all_jobs[~kept]] = -1
    held_by[all_jobs[kept]] = all_rows[kept]
    bid_of[all_jobs[kept]] = all_bids[kept]
    full = kept & (rank == cap[offers] - 1)  # the lowest kept bid of an offer now full sets its price
    price[offers[full]] = all_bids[full]
