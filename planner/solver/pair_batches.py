"""A workload's candidates: which batches of each layout a plan can need, pruned.

Every feasible batch of one layout has the same accelerators, price, NICs and KV cache per request;
a larger batch makes more tokens per second (and costs less per token). So a layout's fastest
feasible batch serves any plan at least as well as a slower one, except where the planning model
asks a replica for less:

- **TTFT of a prefill-decode pair.** A request joins the next decode step, longer at a larger
  batch, and a prefill and a decode candidate whose request TTFT (prefill, KV hand-off, that step)
  breaks the limit may not serve together. For each prefill candidate: the fastest decode batch
  whose pair with it meets the limit.
- **Whole prefill replicas feeding one decode replica** (no demand: a workload's plan is one
  aggregated replica, or one decode replica and as many replicas of one prefill candidate as keep it
  fed, all in the fleet's racks). A slower decode batch may need fewer prefill replicas, and only
  so many fit beside the other workloads. For each prefill candidate and count n up to what the
  fastest compatible batch needs: the fastest compatible batch that n replicas feed. Of these
  pairs, only those no other pair (or, aggregated, no other replica) beats on the objective, the
  cost cap and the racks it takes (`plan_frontier`) keep their candidates.
- **TPOT** (objective min_tpot): every batch trades TPOT against tokens per second. Without a
  demand a layout's batches that no faster one beats on TPOT and price (aggregated) or on TPOT and
  the prefill replicas that feed it (decode); with one, the batches are refined from the batch
  grid's ladder until a relaxation proves the plan optimal (latency_batches).

Everything else the model asks of a batch grows with it (HBM, TPOT and NIC limits are checked per
batch; a demand wants tokens). The exhaustive reference (planner/solver/reference.py), which
enumerates every batch, checks this on small problems.
"""

from dataclasses import replace

import numpy as np

from planner.modes import BatchLimit, ServingRole
from planner.physics.links import kv_handoff_s
from planner.problem.resolve import ResolvedWorkload
from planner.problem.schema import Objective
from planner.solver.candidates import (
    Candidate,
    Chain,
    RackAnalysis,
    pair_ttft_p90_s,
    replica_usd_per_hour,
)
from planner.solver.latency_batches import LatencyLadder
from planner.solver.model_builder import (
    THROUGHPUT_RESOLUTION,
    USD_RESOLUTION,
    RackPool,
    _scaled,
    pool_replicas,
    unit_figure,
    unit_figure_of,
)
from planner.solver.plan_frontier import capacity, fits, footprint, plan_frontier
from planner.solver.pruning import pareto_prune

__all__ = ["best_plan", "compatible", "workload_candidates"]


def compatible(chain: Chain, prefill: Candidate, ttft_limit_s: float | None) -> np.ndarray:
    """Which feasible batches of `chain` may pair with `prefill`: the model's test (pair_ttft_p90_s
    within the limit, model_builder.split_pairs_over_ttft), at every batch at once."""
    if ttft_limit_s is None:
        return np.ones(len(chain.members), dtype=bool)
    join = chain.table.ttft_p90_s[chain.members]
    pair = prefill.ttft_p90_s + kv_handoff_s(prefill.kv_handoff_bytes, prefill.nic_bytes_per_s, chain.handoff[1]) + join
    return pair <= ttft_limit_s * (1 + 1e-12)


def _rate(rate: float) -> int:
    return _scaled(rate, THROUGHPUT_RESOLUTION, round_up=False)


def front(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Positions on the Pareto front of two 'lower is better' figures: none other is no worse in both
    and better in one (of equals, the first)."""
    out, best = [], None
    for k in np.lexsort((np.arange(len(first)), second, first)):
        if best is None or second[k] < best:
            out.append(int(k))
            best = second[k]
    return np.array(sorted(out), dtype=int)


def _fed_pairs(chain: Chain, prefills: list[Candidate], ttft_limit_s: float | None, holds: list[tuple[int | None, int]],
               latency: bool) -> list[tuple[int, int, int]]:
    """(prefill index, prefill replicas, table index) of the pairs worth weighing for one decode
    layout without a demand: for each prefill candidate and count n up to what the fastest
    compatible batch needs (and the fleet holds), the fastest compatible batch n replicas feed, each
    batch once with the fewest replicas that feed it. With `latency` (min_tpot), the compatible
    batches no other beats on TPOT and tokens per second to feed."""
    rates = np.array([_rate(float(r)) for r in chain.rates[chain.members]], dtype=np.int64)
    out = []
    for k, p in enumerate(prefills):
        ok = np.flatnonzero(compatible(chain, p, ttft_limit_s))
        feed = _rate(p.output_tokens_per_s)
        if not len(ok) or feed <= 0:
            continue
        if latency:
            picked = ok[front(chain.table.tpot_s[chain.members[ok]], rates[ok])]
        else:
            held, cap = holds[k]
            by_rate = ok[np.lexsort((-ok, rates[ok]))]  # ascending rate; of equal rates the smallest batch last
            need = -(-int(rates[by_rate[-1]]) // feed)
            counts = np.arange(1, min(need, cap) + 1) if held is not None else np.array([min(need, cap)])
            at = np.searchsorted(rates[by_rate], counts * feed, side="right") - 1  # the fastest each count feeds
            picked = np.unique(by_rate[at[at >= 0]])
        out += [(k, -(-int(rates[i]) // feed), int(chain.members[i])) for i in picked]
    return out


def _quickest(chain: Chain) -> set[int]:
    """Without a demand, for min_tpot: a layout's feasible batches no other beats on TPOT and price."""
    members = chain.members
    return {int(members[i]) for i in front(chain.table.tpot_s[members], chain.table.storage_usd_per_s[members])}


def _ttft_batches(chain: Chain, prefills: list[Candidate], ttft_limit_s: float | None) -> set[int]:
    """With a demand: the fastest batch, and for each prefill candidate the fastest that pairs with it
    (`compatible` and `Chain.best` for every prefill candidate at once: a row each)."""
    picked = {chain.best()}
    if ttft_limit_s is None or not prefills:  # every batch pairs with every prefill candidate
        return picked
    join = chain.table.ttft_p90_s[chain.members]
    ahead = np.array([p.ttft_p90_s + kv_handoff_s(p.kv_handoff_bytes, p.nic_bytes_per_s, chain.handoff[1]) for p in prefills])
    ok = ahead[:, None] + join[None, :] <= ttft_limit_s * (1 + 1e-12)
    rates = chain.rates[chain.members]
    masked = np.where(ok, rates[None, :], -np.inf)
    best = masked.max(axis=1)
    for row in np.flatnonzero(ok.any(axis=1)):  # of equal rates the smallest batch, as Chain.best
        picked.add(int(chain.members[np.flatnonzero(ok[row] & (rates == best[row]))[0]]))
    return picked


def _at(chain: Chain, i: int, workload: str, label: BatchLimit = BatchLimit.PAIRING, ladder: LatencyLadder | None = None) -> Candidate:
    """The candidate at table index `i` of `chain`, for `workload`, labelled with what stops the
    fastest batch or `label` (through `ladder`, which may relax it)."""
    c = chain.candidate(i, chain.best_reason() if i == chain.best() else label)
    c = c if c.workload == workload else replace(c, workload=workload)
    return c if ladder is None else ladder.candidate(chain, i, c)


def workload_candidates(workload: ResolvedWorkload, analyses: list[RackAnalysis], pools: dict[str, RackPool], max_replicas: int,
                        objective: Objective, cost_cap: bool, ladder: LatencyLadder | None = None, roomy: bool = False) -> list[Candidate]:
    """A workload's candidates on every rack type: aggregated and prefill candidates pruned
    (pruning.pareto_prune); decode candidates at the batches their pairing can need (module
    docstring), pruned with their partners; without a demand, the prefill and decode candidates of
    the pairs on the plan frontier. With `ladder` (objective min_tpot), every layout's batches are
    those the ladder keeps (latency_batches), or without a demand those on its front of TPOT and
    price (aggregated) or of TPOT and rate to feed (decode). `roomy`: every workload's best plan
    fits beside every other's (`best_plan`), so without a demand only the fastest compatible batch
    of each pair can be needed."""
    use_latency = ladder is not None
    no_demand = workload.output_tokens_per_s is None
    prefills = pareto_prune([c for a in analyses for c in a.candidates if c.role is ServingRole.PREFILL], use_latency)
    chains = [chain for a in analyses for chain in a.chains if chain.inp.role is ServingRole.DECODE]
    if ladder is None:
        aggregated = [c for a in analyses for c in a.candidates if c.role is ServingRole.AGGREGATED]
    else:  # aggregated layouts' batches from their chains
        aggregated = [_at(chain, i, workload.name, BatchLimit.LADDER, ladder) for a in analyses for chain in a.chains
                      if chain.inp.role is ServingRole.AGGREGATED
                      for i in ladder.batches(chain, _quickest(chain) if no_demand else set(chain.ladder()))]
    aggregated = pareto_prune(aggregated, use_latency)
    if not prefills or not chains:
        return aggregated + prefills + [_at(chain, chain.best(), workload.name) for chain in chains]
    if no_demand:
        return aggregated + _frontier_pairs(workload, prefills, chains, pools, max_replicas, objective, cost_cap, use_latency, roomy)
    decode = []
    for chain in chains:
        paired = _ttft_batches(chain, prefills, workload.ttft_limit_s)
        kept = sorted(paired) if ladder is None else ladder.batches(chain, paired | set(chain.ladder()))
        decode += [_at(chain, i, workload.name, BatchLimit.PAIRING if i in paired else BatchLimit.LADDER, ladder) for i in kept]
    partners = [sum(1 << k for k, p in enumerate(prefills) if _pairs(p, q, workload.ttft_limit_s)) for q in decode]
    return aggregated + prefills + pareto_prune(decode, use_latency, partners=partners)


def _frontier_pairs(workload: ResolvedWorkload, prefills: list[Candidate], chains: list[Chain], pools: dict[str, RackPool],
                    max_replicas: int, objective: Objective, cost_cap: bool, latency: bool, roomy: bool) -> list[Candidate]:
    """Without a demand: the prefill and decode candidates of the pairs (`_fed_pairs`) that fit the
    fleet and no other pair beats (plan_frontier), each figure in the model's integer units."""
    held = [None if roomy else pool_replicas(p, pools.get(p.rack_id)) for p in prefills]
    holds = [(n, max_replicas if n is None else min(n, max_replicas)) for n in held]
    room = np.array(capacity(pools), dtype=np.int64)
    prefill_figures = [(unit_figure(p, objective), _usd(p.usd_per_hour), np.array(footprint(p, 1, pools), dtype=np.int64)) for p in prefills]
    rows, pairs = [], []
    for chain in chains:
        inp, table = chain.inp, chain.table
        taken = np.array(footprint(chain.candidate(chain.best(), chain.reason), 1, pools), dtype=np.int64)
        for k, n, i in _fed_pairs(chain, prefills, workload.ttft_limit_s, holds, latency):
            if n > max_replicas or not (roomy or fits(n * prefill_figures[k][2] + taken, room)):  # roomy: racks aside
                continue
            usd = replica_usd_per_hour(inp, table, i)
            term = unit_figure_of(objective, float(table.tpot_s[i]), float(table.sustained_output_tokens_per_s[i]), inp.layout.n_accelerators, usd)
            term = max(prefill_figures[k][0], term) if objective is Objective.MIN_TPOT else prefill_figures[k][0] + term
            rows.append([term, n * prefill_figures[k][1] + _usd(usd) if cost_cap else 0, *(n * prefill_figures[k][2] + taken)])
            pairs.append((k, chain, i))
    out: dict[tuple, Candidate] = {}
    for r in plan_frontier(np.array(rows, dtype=np.int64).reshape(len(rows), -1)):
        k, chain, i = pairs[r]
        for c in (prefills[k], _at(chain, i, workload.name)):
            out.setdefault((c.role, c.rack_id, c.layout, c.batch, c.kv_tier, c.draft_tokens), c)
    return list(out.values())


def _usd(usd_per_hour: float) -> int:
    return _scaled(usd_per_hour, USD_RESOLUTION, round_up=True)


def _pairs(p: Candidate, q: Candidate, ttft_limit_s: float | None) -> bool:
    """Whether the model lets `p` and `q` serve together (model_builder.split_pairs_over_ttft's test)."""
    return ttft_limit_s is None or pair_ttft_p90_s(p, q) <= ttft_limit_s * (1 + 1e-12)


def best_plan(candidates: list[Candidate], pools: dict[str, RackPool], ttft_limit_s: float | None,
              objective: Objective) -> tuple[int, int, np.ndarray] | None:
    """Without a demand: the objective term, price (micro-USD per hour) and footprint of the best plan
    of one workload over `candidates`, racks aside (an aggregated replica, or a decode replica and the
    fewest replicas of a prefill candidate it pairs with that feed it); None if it has none."""
    plans = []
    prefills = [c for c in candidates if c.role is ServingRole.PREFILL]
    for c in candidates:
        if c.role is ServingRole.AGGREGATED:
            plans.append((unit_figure(c, objective), _usd(c.usd_per_hour), np.array(footprint(c, 1, pools))))
        elif c.role is ServingRole.DECODE:
            for p in (p for p in prefills if _pairs(p, c, ttft_limit_s) and _rate(p.output_tokens_per_s) > 0):
                n = -(-_rate(c.output_tokens_per_s) // _rate(p.output_tokens_per_s))
                term = max(unit_figure(p, objective), unit_figure(c, objective)) if objective is Objective.MIN_TPOT else \
                    unit_figure(p, objective) + unit_figure(c, objective)
                plans.append((term, n * _usd(p.usd_per_hour) + _usd(c.usd_per_hour),
                              n * np.array(footprint(p, 1, pools)) + np.array(footprint(c, 1, pools))))
    return min(plans, key=lambda plan: (plan[0], plan[1], int(plan[2].sum())), default=None)
