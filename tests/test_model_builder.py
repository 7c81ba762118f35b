"""Each constraint family of the CP-SAT model on tiny hand-made data: feasible as given, infeasible
with one decision forced into a violation, feasible again with the allowed alternative forced."""

from dataclasses import replace

import pytest
from expect import expect_feasible, expect_infeasible, expect_objective

from planner.hardware.catalog import load_hardware_catalog
from planner.model.catalog import load_model_catalog
from planner.modes import ServingRole
from planner.physics.deployment import Layout, Precisions
from planner.physics.inputs import DeploymentInputs
from planner.precision import FlopsFormat, Precision
from planner.problem.schema import Objective
from planner.solver.candidates import Candidate
from planner.solver.model_builder import PlanningData, RackPool, rack_items
from planner.solver.reference import fits_racks

PRECISIONS = Precisions(Precision.BF16, Precision.BF16, Precision.BF16, FlopsFormat.BF16)


HARDWARE = load_hardware_catalog()
ARCH = load_model_catalog()["llama-3.1-8b"]  # the model builder reads only the candidates' figures and shapes


def cand(workload="w", rack="r72", tp=1, dp=1, ep=1, pp=1, rate=1000.0, usd=10.0, tpot=0.02, batch=64,
         role=ServingRole.AGGREGATED) -> Candidate:
    rack_type = replace(HARDWARE.racks["hgx-h100"], id=rack)
    inputs = DeploymentInputs(ARCH, rack_type, Layout(tp=tp, ep=ep, pp=pp, dp_attn=dp), batch, 1024, 256, PRECISIONS, HARDWARE.overheads,
                              role=role)
    return Candidate(workload, "m", inputs, tpot, 0.5, rate, rate, usd, 0.5, "weights", "hbm", False)


def data(candidates, demand=None, pools=None, objective=Objective.MIN_COST, cap=None, workloads=("w",)) -> PlanningData:
    demands = demand if isinstance(demand, dict) else {w: demand for w in workloads}
    return PlanningData(tuple(candidates), tuple(workloads), demands,
                        pools or {"r72": RackPool("r72", 72, 2), "r8": RackPool("r8", 8, 3)}, objective, cap)


def test_demand_family():
    small, big = cand(tp=8, rate=1000, usd=8), cand(tp=64, rate=9000, usd=64)
    d = data([small, big], demand=5000)
    with expect_objective(d, 40_000_000):  # 5 x small ($8/h) beats 1 x big ($64/h): 40 $/h in micro-USD
        pass
    with expect_infeasible(d) as (model, v):
        model.add(v.replicas[0] == 4)  # 4 x 1000 tok/s alone cannot serve 5000
        model.add(v.replicas[1] == 0)
    with expect_feasible(d) as (model, v):
        model.add(v.replicas[1] == 1)  # the allowed alternative: one big replica


def test_rack_budget_packs_power_of_two_stages_exactly():
    """Two 72-GPU racks hold 64 + 64 + 8 + 8 but not 64 + 64 + 16: the 16 fits in neither rack's
    leftover 8, although the total (144) equals the racks' 144 accelerators."""
    c64, c16, c8 = cand(tp=64, rate=64), cand(tp=16, rate=16), cand(tp=8, rate=8)
    d = data([c64, c16, c8], demand=144)  # one token/s per accelerator: both plans below serve it
    with expect_infeasible(d) as (model, v):
        model.add(v.replicas[0] == 2)
        model.add(v.replicas[1] == 1)
    assert not fits_racks(d, {0: 2, 1: 1})
    with expect_feasible(d) as (model, v):
        model.add(v.replicas[0] == 2)
        model.add(v.replicas[2] == 2)
    assert fits_racks(d, {0: 2, 2: 2})


def test_stages_of_a_whole_non_power_of_two_rack_take_whole_racks():
    full = cand(tp=8, dp=9, rate=72)  # a 72-accelerator stage: the whole rack
    assert rack_items(full, RackPool("r72", 72, 2)) == ("racks", 1)
    d = data([full, cand(tp=8, rate=8)], demand=144)
    with expect_infeasible(d) as (model, v):
        model.add(v.replicas[0] == 2)
        model.add(v.replicas[1] == 1)  # both racks are taken whole
    with expect_feasible(d) as (model, v):
        model.add(v.replicas[0] == 1)
        model.add(v.replicas[1] == 9)  # nine 8-GPU stages fill the other rack


def test_pipeline_stages_count_separately():
    two_stage = cand(tp=64, pp=2, rate=500)  # 2 stages of 64: one per rack
    d = data([two_stage], demand=1)
    with expect_feasible(d) as (model, v):
        model.add(v.replicas[0] == 1)
    with expect_infeasible(d) as (model, v):
        model.add(v.replicas[0] == 2)  # 4 stages of 64 need 4 racks


def test_unlimited_pools_have_no_budget():
    d = data([cand(tp=64, rate=10)], demand=10_000, pools={"r72": RackPool("r72", 72, None)})
    with expect_objective(d, 1000 * 10_000_000):  # 1000 replicas at $10/h
        pass


def test_cost_cap_family():
    fast, slow = cand(tp=8, tpot=0.01, usd=80, rate=1000), cand(tp=8, tpot=0.05, usd=8, rate=1000)
    d = data([fast, slow], demand=1000, objective=Objective.MIN_TPOT, cap=50.0)
    with expect_objective(d, 50_000_000):  # the fast one costs $80/h > $50/h cap: TPOT 50 ms
        pass
    with expect_infeasible(d) as (model, v):
        model.add(v.used[0] == 1)
    with expect_objective(replace(d, cost_cap_usd_per_hour=100.0), 10_000_000):
        pass


def test_one_deployment_per_workload_without_demand():
    cheap, dear = cand(rate=1000, usd=1), cand(rate=1000, usd=2)
    d = data([cheap, dear], demand=None)
    with expect_objective(d, round(1 / 3600 / 1000 * 1e6 / 1e-6)):  # $1/h at 1000 tok/s in micro-USD per Mtok
        pass
    with expect_infeasible(d) as (model, v):
        model.add(v.used[0] + v.used[1] == 2)


def test_exclusions_forbid_a_combination():
    a, b = cand(rate=1000, usd=1), cand(rate=1000, usd=2)
    d = replace(data([a, b], demand=1000), excluded=(frozenset({0}),))
    with expect_objective(d, 2_000_000):
        pass


def test_max_throughput_per_accelerator_with_demand_minimises_accelerators():
    wide, narrow = cand(tp=64, rate=64_000, usd=1), cand(tp=8, rate=4_000, usd=100)
    d = data([wide, narrow], demand=8_000, objective=Objective.MAX_THROUGHPUT_PER_ACCELERATOR)
    with expect_objective(d, 16):  # 2 x 8 GPUs beat 1 x 64 GPUs, whatever they cost
        pass


@pytest.mark.parametrize("bad", [0, -1])
def test_replica_bounds_never_negative(bad):
    d = data([cand(rate=1000)], demand=1, pools={"r72": RackPool("r72", 72, 0)})
    with expect_infeasible(d):
        pass


def test_max_throughput_per_accelerator_combines_pools_as_a_rate_matched_pair():
    """Without a demand, a prefill pool feeding 4,000 output tokens/s per GPU and a decode pool making
    1,000/s per GPU serve a request stream at 1 / (1/4000 + 1/1000) = 800 tokens/s per GPU of the pair,
    not 5,000: the objective counts accelerator-seconds per token, 250 us + 1000 us = 1,250 us. An
    aggregated candidate at 900/s per GPU (1,111 us) therefore beats the pools."""

    prefill = cand(rate=4000, role=ServingRole.PREFILL)
    decode = cand(rate=1000, role=ServingRole.DECODE)
    d = data([prefill, decode], objective=Objective.MAX_THROUGHPUT_PER_ACCELERATOR)
    with expect_objective(d, 1_250_000):  # ns per output token
        pass
    aggregated = cand(rate=900)
    d = data([prefill, decode, aggregated], objective=Objective.MAX_THROUGHPUT_PER_ACCELERATOR)
    with expect_objective(d, 1_111_112):  # 1/900 s rounded up to whole ns
        pass


def test_without_demand_pools_are_rate_matched():
    """No demand: a decode replica making 2,500 tokens/s needs ceil(2500 / 1000) = 3 prefill replicas
    that each feed 1,000 (one prefill and one decode replica would starve the decode pool)."""
    from planner.solver.search import solve_data

    prefill = cand(rate=1000, usd=1, role=ServingRole.PREFILL)
    decode = cand(rate=2500, usd=1, role=ServingRole.DECODE)
    raw = solve_data(data([prefill, decode]), time_limit_s=10, seed=0, workers=1)
    assert raw.status == "OPTIMAL" and raw.chosen == {0: 3, 1: 1}
