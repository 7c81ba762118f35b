"""The CP-SAT model: fully prepared data in, one small builder per constraint family.

Physics never appears here: every number comes from a `Candidate` (evaluated by the roofline) and
is scaled to integers in one place (`_scaled`). Each user-facing constraint family gets an
enforcement literal (`PlanVars.literal`), so that an infeasible problem can be explained with
CP-SAT assumptions.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.modes import ConstraintFamily, FamilyKind, ServingRole, StageKind
from planner.physics.cost import usd_per_million_tokens
from planner.placement.packing import aligned_free_blocks, stage_kind
from planner.problem.schema import Objective
from planner.solver.candidates import Candidate, pair_ttft_p90_s
from planner.units import SECONDS_PER_HOUR

__all__ = [
    "THROUGHPUT_RESOLUTION",
    "TIME_RESOLUTION_S",
    "USD_RESOLUTION",
    "PlanVars",
    "PlanningData",
    "RackPool",
    "build_model",
    "pool_replicas",
    "primary_objective",
    "rack_items",
    "tie_break_objective",
    "unit_figure",
    "unit_figure_of",
]

USD_RESOLUTION = 1e-6  # money in micro-dollars (per hour, or per million tokens)
THROUGHPUT_RESOLUTION = 1e-3  # tokens per second in milli-tokens per second
TIME_RESOLUTION_S = 1e-9  # latencies in nanoseconds
INT64_SAFE = 2**62


@dataclass(frozen=True)
class RackPool:
    """Racks of one type the fleet has (`count` None: as many as needed). `broken` lists, for each
    rack with unavailable accelerators, their indices; the other racks are whole."""

    rack_id: str
    domain_size: int
    count: int | None
    broken: tuple[tuple[int, ...], ...] = ()

    @property
    def perfect(self) -> int:
        return (self.count or 0) - len(self.broken)

    def slots(self, size: int) -> int:
        """Aligned free blocks of `size` in the racks with broken accelerators."""
        return sum(aligned_free_blocks(self.domain_size, b, size) for b in self.broken)


@dataclass(frozen=True)
class PlanningData:
    """Everything the model needs, prepared before modelling."""

    candidates: tuple[Candidate, ...]  # canonical order
    workloads: tuple[str, ...]
    demand_tokens_per_s: dict[str, float | None]  # workload -> output tokens/s to serve (None: cost per token)
    pools: dict[str, RackPool]
    objective: Objective
    cost_cap_usd_per_hour: float | None = None
    max_replicas: int = 4096
    excluded: tuple[frozenset[int], ...] = ()  # sets of candidates that may not all be used together
    ttft_limit_s: dict[str, float | None] = field(default_factory=dict)  # workload -> TTFT limit (checked on prefill-decode pairs)
    forced_split: dict[str, bool] = field(default_factory=dict)  # workload -> serving mode fixed (True: disaggregated)
    ladder: object | None = None  # latency_batches.LatencyLadder: min_tpot's batches, refined while solving (solve_refined)

    @property
    def has_demand(self) -> bool:
        """Any workload with a demand: the plan is a fleet, its cost per hour the objective."""
        return any(d is not None for d in self.demand_tokens_per_s.values())

    def candidates_of(self, workload: str, role: ServingRole | None = None) -> list[int]:
        return [j for j, c in enumerate(self.candidates) if c.workload == workload and (role is None or c.role is role)]

    def split_pairs_over_ttft(self, workload: str) -> list[tuple[int, int]]:
        """(prefill, decode) candidate pairs whose request TTFT (prefill + KV hand-off + decode join, at
        the 90th percentile) breaks the workload's limit: they may not serve the workload together."""
        limit = self.ttft_limit_s.get(workload)
        if limit is None:
            return []
        decodes = self.candidates_of(workload, ServingRole.DECODE)
        return [(p, q) for p in self.candidates_of(workload, ServingRole.PREFILL) for q in decodes
                if pair_ttft_p90_s(self.candidates[p], self.candidates[q]) > limit * (1 + 1e-12)]


def _scaled(value: float, resolution: float, round_up: bool) -> int:
    """Real value -> integer units. Demands and costs round up, capacities and rates down, so that
    every integer-feasible plan is feasible in real units."""
    x = value / resolution
    eps = 1e-9 * max(1.0, abs(x))  # float noise of the division, not a real fraction of a unit
    return math.ceil(x - eps) if round_up else math.floor(x + eps)


def _check_linear(coefficients: Iterable[int], upper_bounds: Iterable[int], name: str) -> None:
    """Refuse a constraint whose worst-case activity could overflow int64 (docs/cpsat.md section 2)."""
    worst = sum(abs(c) * u for c, u in zip(coefficients, upper_bounds))
    if worst >= INT64_SAFE:
        raise OverflowError(f"{name}: activity bound {worst:.3e} >= 2^62; coarsen the units")


def rack_items(c: Candidate, pool: RackPool) -> tuple[StageKind, int]:
    """How a replica's pipeline stages occupy racks: ('slots', stage size) for a power-of-two stage
    that fits one rack, or ('racks', racks per stage) for a stage that takes whole racks."""
    return stage_kind(c.stage_size, pool.domain_size)


@dataclass
class PlanVars:
    """Decision variables: replicas and a 'used' flag per candidate, family literals, objective parts."""

    model: cp_model.CpModel
    replicas: list[cp_model.IntVar]
    used: list[cp_model.IntVar]
    families: dict[str, cp_model.IntVar] = field(default_factory=dict)
    workload_tpot: dict[str, cp_model.IntVar] = field(default_factory=dict)
    split: dict[str, cp_model.IntVar | int] = field(default_factory=dict)  # workload -> 1 when served by prefill + decode pools
    roles: dict[int, ServingRole] = field(default_factory=dict)  # candidate -> role (for hints)
    workload_of: dict[int, str] = field(default_factory=dict)

    def literal(self, family: ConstraintFamily) -> cp_model.IntVar:
        """Enforcement literal of a constraint family (created on first use)."""
        if family not in self.families:
            self.families[family] = self.model.new_bool_var(family)
        return self.families[family]

    def blocks(self) -> dict[int, str]:
        """Each decision variable's workload (by variable index): the blocks of a decomposition."""
        owner = {}
        for j, w in self.workload_of.items():
            owner[self.replicas[j].index] = owner[self.used[j].index] = w
        for w, mode in self.split.items():
            if not isinstance(mode, int):
                owner[mode.index] = w
        for w, var in self.workload_tpot.items():
            owner[var.index] = w
        return owner

    def extract(self, solver: cp_model.CpSolver) -> dict[int, int]:
        """Candidate index -> replicas, for the candidates the solution uses."""
        return {j: solver.value(r) for j, r in enumerate(self.replicas) if solver.value(r) > 0}


def replica_bound(data: PlanningData, j: int) -> int:
    """No plan needs more replicas of a candidate than to serve its workload's demand alone."""
    c = data.candidates[j]
    demand = data.demand_tokens_per_s.get(c.workload)
    if demand is None and c.role is not ServingRole.PREFILL:
        return 1
    if demand is None:  # prefill replicas feeding one decode replica, whichever decode candidate it is
        fed = max((_rate(data, q) for q in data.candidates_of(c.workload, ServingRole.DECODE)), default=0)
        bound = -(-fed // max(_rate(data, j), 1))
    else:
        bound = math.ceil(demand / c.output_tokens_per_s)
    held = pool_replicas(c, data.pools.get(c.rack_id))
    if held is not None:
        bound = min(bound, held)
    return max(0, min(bound, data.max_replicas))


def pool_replicas(c: Candidate, pool: RackPool | None) -> int | None:
    """How many replicas of `c` its rack type's pool holds on its own (None: the pool is unbounded)."""
    if pool is None or pool.count is None:
        return None
    kind, size = rack_items(c, pool)
    stages = pool.perfect * (pool.domain_size // size) + pool.slots(size) if kind is StageKind.SLOTS else pool.perfect // size
    return stages // c.stages


def new_vars(model: cp_model.CpModel, data: PlanningData) -> PlanVars:
    replicas, used = [], []
    for j, c in enumerate(data.candidates):
        name = f"{c.workload}@{c.rack_id}:{c.role}[tp={c.layout.tp},ep={c.layout.ep},pp={c.layout.pp},dp={c.layout.dp_attn},b={c.batch}]"
        replicas.append(model.new_int_var(0, replica_bound(data, j), f"replicas:{name}"))
        used.append(model.new_bool_var(f"used:{name}"))
    return PlanVars(model, replicas, used, roles={j: c.role for j, c in enumerate(data.candidates)},
                    workload_of={j: c.workload for j, c in enumerate(data.candidates)})


def add_replicas_need_use(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """A candidate has replicas exactly when it is used."""
    for j in range(len(data.candidates)):
        model.add(v.replicas[j] >= v.used[j])
        model.add(v.replicas[j] <= replica_bound(data, j) * v.used[j])


def add_serving_modes(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """A workload is served either by aggregated replicas or by prefill and decode pools; with
    candidates of both kinds a Boolean picks the mode. Prefill-decode pairs that would break the
    TTFT limit are never used together."""
    for w in data.workloads:
        aggregated = data.candidates_of(w, ServingRole.AGGREGATED)
        prefills, decodes = data.candidates_of(w, ServingRole.PREFILL), data.candidates_of(w, ServingRole.DECODE)
        split = prefills + decodes if prefills and decodes else []
        for j in prefills + decodes if not split else []:  # a pool without its partner serves nothing (decode replicas
            model.add(v.used[j] == 0)  # with no prefill pool met the demand on their own when every prefill layout broke TTFT)
        if w in data.forced_split:
            mode = int(data.forced_split[w])
        elif aggregated and split:
            mode = model.new_bool_var(f"split[{w}]")
        else:
            mode = int(bool(split))
        v.split[w] = mode
        for j in aggregated:
            model.add(v.used[j] + mode <= 1)
        for j in split:
            model.add(v.used[j] <= mode)
        for p, q in data.split_pairs_over_ttft(w):
            model.add(v.used[p] + v.used[q] <= 1).only_enforce_if(v.literal(ConstraintFamily(FamilyKind.TTFT, w)))


def add_demand(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """Each workload's replicas together serve its demand in output tokens per second: aggregated
    or decode replicas make the tokens; with pools, prefill replicas must keep up with the prompts
    (their rate is counted in the output tokens the prompts they prefill will produce)."""
    for w in data.workloads:
        demand = data.demand_tokens_per_s[w]
        if demand is None:
            continue
        need = _scaled(demand, THROUGHPUT_RESOLUTION, round_up=True)
        literal = v.literal(ConstraintFamily(FamilyKind.DEMAND, w))
        makers = data.candidates_of(w, ServingRole.AGGREGATED) + data.candidates_of(w, ServingRole.DECODE)
        rates = [_scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False) for j in makers]
        _check_linear(rates, [replica_bound(data, j) for j in makers], f"demand[{w}]")
        model.add(cp_model.LinearExpr.weighted_sum([v.replicas[j] for j in makers], rates) >= need).only_enforce_if(literal)
        prefills = data.candidates_of(w, ServingRole.PREFILL)
        if prefills:
            rates = [_scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False) for j in prefills]
            _check_linear(rates, [replica_bound(data, j) for j in prefills], f"prefill[{w}]")
            fed = cp_model.LinearExpr.weighted_sum([v.replicas[j] for j in prefills], rates)
            model.add(fed >= need * v.split[w]).only_enforce_if(literal)


def add_one_deployment_per_workload(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """Without a demand, each workload gets one replica of one aggregated candidate (cost per token),
    or one decode replica and enough prefill replicas to keep it fed: a rate-matched pair."""
    for w in data.workloads:
        if data.demand_tokens_per_s[w] is not None:
            continue
        literal = v.literal(ConstraintFamily(FamilyKind.SERVE, w))
        mode = v.split[w]
        aggregated = cp_model.LinearExpr.sum([v.used[j] for j in data.candidates_of(w, ServingRole.AGGREGATED)])
        model.add(aggregated + mode == 1).only_enforce_if(literal)
        for role in (ServingRole.PREFILL, ServingRole.DECODE):
            model.add(cp_model.LinearExpr.sum([v.used[j] for j in data.candidates_of(w, role)]) == mode).only_enforce_if(literal)
        decodes, prefills = data.candidates_of(w, ServingRole.DECODE), data.candidates_of(w, ServingRole.PREFILL)
        for q in decodes:
            model.add(v.replicas[q] == v.used[q])
        if decodes and prefills:
            made = cp_model.LinearExpr.weighted_sum([v.replicas[q] for q in decodes], [_rate(data, q) for q in decodes])
            fed = cp_model.LinearExpr.weighted_sum([v.replicas[p] for p in prefills], [_rate(data, p) for p in prefills])
            model.add(fed >= made).only_enforce_if(literal)


def _rate(data: PlanningData, j: int) -> int:
    """A candidate's output tokens per second (for a prefill replica: the tokens its prompts feed), scaled."""
    return _scaled(data.candidates[j].output_tokens_per_s, THROUGHPUT_RESOLUTION, round_up=False)


def add_rack_budget(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """Every pipeline stage sits inside one rack of the fleet (power-of-two stages pack exactly
    when, for each stage size s, the stages of size >= s fit the aligned free s-blocks: s * floor(n/s)
    per whole rack left, plus those of racks with broken accelerators; stages of a whole rack or
    more take whole racks without broken accelerators)."""
    for rack_id, pool in data.pools.items():
        if pool.count is None:
            continue
        js = [j for j, c in enumerate(data.candidates) if c.rack_id == rack_id]
        items = {j: rack_items(data.candidates[j], pool) for j in js}
        whole = cp_model.LinearExpr.weighted_sum([v.replicas[j] for j in js if items[j][0] is StageKind.RACKS],
                                                 [data.candidates[j].stages * items[j][1] for j in js if items[j][0] is StageKind.RACKS])
        literal = v.literal(ConstraintFamily(FamilyKind.RACKS, rack_id))
        model.add(whole <= pool.perfect).only_enforce_if(literal)
        for size in sorted({s for kind, s in items.values() if kind is StageKind.SLOTS}):
            big = [j for j in js if items[j][0] is StageKind.SLOTS and items[j][1] >= size]
            volume = cp_model.LinearExpr.weighted_sum([v.replicas[j] for j in big], [data.candidates[j].stages * items[j][1] for j in big])
            per_whole_rack = size * (pool.domain_size // size)
            model.add(volume <= (pool.perfect - whole) * per_whole_rack + size * pool.slots(size)).only_enforce_if(literal)


def add_cost_cap(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """The fleet's cost per hour stays under the cap (objective min_tpot)."""
    if data.cost_cap_usd_per_hour is None:
        return
    model.add(fleet_cost(v, data) <= _scaled(data.cost_cap_usd_per_hour, USD_RESOLUTION, round_up=False)).only_enforce_if(v.literal(ConstraintFamily(FamilyKind.COST_CAP)))


def add_exclusions(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> None:
    """Forbid plans that use every candidate of an excluded set (to find the next-best plan)."""
    for group in data.excluded:
        model.add(sum(v.used[j] for j in group) <= len(group) - 1)


def fleet_cost(v: PlanVars, data: PlanningData) -> cp_model.LinearExpr:
    """Fleet cost in micro-USD per hour."""
    costs = [_scaled(c.usd_per_hour, USD_RESOLUTION, round_up=True) for c in data.candidates]
    return cp_model.LinearExpr.weighted_sum(v.replicas, costs)


def unit_figure(c: Candidate, objective: Objective) -> int:
    """What one used candidate adds to a workload's objective without a demand, in the model's
    integer units (`unit_figure_of`)."""
    return unit_figure_of(objective, c.tpot_s, c.output_tokens_per_s, c.accelerators, c.usd_per_hour)


def unit_figure_of(objective: Objective, tpot_s: float, output_tokens_per_s: float, accelerators: int, usd_per_hour: float) -> int:
    """What one replica with these figures adds to a workload's objective without a demand:
    micro-USD per million output tokens (min_cost), accelerator-nanoseconds per output token
    (max_throughput_per_accelerator), or its TPOT in nanoseconds (min_tpot, whose workload term is
    the largest of these); as Candidate's properties compute them."""
    if objective is Objective.MIN_TPOT:
        return _scaled(tpot_s, TIME_RESOLUTION_S, round_up=True)
    if objective is Objective.MAX_THROUGHPUT_PER_ACCELERATOR:
        return _scaled(1.0 / (output_tokens_per_s / accelerators), TIME_RESOLUTION_S, round_up=True)
    return _scaled(usd_per_million_tokens(usd_per_hour / SECONDS_PER_HOUR, output_tokens_per_s), USD_RESOLUTION, round_up=True)


def token_cost(v: PlanVars, data: PlanningData) -> cp_model.LinearExpr:
    """Sum over workloads of the chosen candidate's micro-USD per million output tokens."""
    return cp_model.LinearExpr.weighted_sum(v.used, [unit_figure(c, Objective.MIN_COST) for c in data.candidates])


def accelerators_used(v: PlanVars, data: PlanningData) -> cp_model.LinearExpr:
    return cp_model.LinearExpr.weighted_sum(v.replicas, [c.accelerators for c in data.candidates])


def accelerator_time_per_token(v: PlanVars, data: PlanningData) -> cp_model.LinearExpr:
    """Sum over workloads of the accelerator-nanoseconds one output token takes on the chosen
    candidates: the inverse of throughput per accelerator, and additive, so that a prefill pool
    and a decode pool combine as 1/r_prefill + 1/r_decode (a rate-matched pair) instead of adding
    their per-accelerator rates."""
    times = [unit_figure(c, Objective.MAX_THROUGHPUT_PER_ACCELERATOR) for c in data.candidates]
    return cp_model.LinearExpr.weighted_sum(v.used, times)


def tpot_sum(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> cp_model.LinearExpr:
    """Sum over workloads of the slowest TPOT among the candidates a workload uses (ns)."""
    for w in data.workloads:
        js = data.candidates_of(w)
        times = {j: unit_figure(data.candidates[j], Objective.MIN_TPOT) for j in js}
        var = model.new_int_var(0, max(times.values(), default=0), f"tpot[{w}]")
        for j in js:
            model.add(var >= times[j]).only_enforce_if(v.used[j])
        v.workload_tpot[w] = var
    return sum(v.workload_tpot.values())


def primary_objective(model: cp_model.CpModel, v: PlanVars, data: PlanningData) -> tuple[cp_model.LinearExpr, float, str]:
    """The objective to minimise, its resolution in user units, and the unit's name."""
    if data.objective is Objective.MIN_TPOT:
        return tpot_sum(model, v, data), TIME_RESOLUTION_S, "s (sum of workload TPOTs)"
    if data.objective is Objective.MAX_THROUGHPUT_PER_ACCELERATOR:
        if data.has_demand:
            return accelerators_used(v, data), 1.0, "accelerators"
        return accelerator_time_per_token(v, data), TIME_RESOLUTION_S, "accelerator-seconds per output token (sum over workloads)"
    if data.has_demand:
        return fleet_cost(v, data), USD_RESOLUTION, "USD per hour"
    return token_cost(v, data), USD_RESOLUTION, "USD per million output tokens (sum over workloads)"


def tie_break_objective(v: PlanVars, data: PlanningData) -> cp_model.LinearExpr:
    """Among equally good plans prefer fewer deployments, then candidates early in canonical order,
    then fewer replicas."""
    n = len(data.candidates)
    order = sorted(range(n), key=lambda j: data.candidates[j].sort_key())
    rank = {j: r for r, j in enumerate(order)}
    weight_used = [(n + 1) * (n + 1) + (n + 1) * rank[j] for j in range(n)]
    return cp_model.LinearExpr.weighted_sum(v.used, weight_used) + sum(v.replicas)


def build_model(data: PlanningData) -> tuple[cp_model.CpModel, PlanVars]:
    """The whole model without an objective; every family literal is left free (callers fix them
    or pass them as assumptions)."""
    model = cp_model.CpModel()
    v = new_vars(model, data)
    add_replicas_need_use(model, v, data)
    add_serving_modes(model, v, data)
    add_demand(model, v, data)
    add_one_deployment_per_workload(model, v, data)
    add_rack_budget(model, v, data)
    add_cost_cap(model, v, data)
    add_exclusions(model, v, data)
    return model, v
