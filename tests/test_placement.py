"""Concrete placement: stages on accelerators around broken ones (against brute force), experts on
ranks (against brute force and the EPLB-style baseline), plan export and the independent check."""

import itertools
import json
import operator
from functools import cache, reduce

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.cli.main import main
from planner.model.expert_loads import synthetic_profile
from planner.output.export import export_plan, placement_document
from planner.output.plan_report import solve_record
from planner.output.validate import check_plan
from planner.paths import data_dir
from planner.placement.experts import (
    eplb_baseline,
    max_overlap_assignment,
    place_experts,
)
from planner.placement.local_search import pack
from planner.placement.packing import PlacementFailed, RackSlots, StageItem, place
from planner.placement.replicas import capped_counts
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver.solve import solve

# ---------------------------------------------------------------------------------------------
# stages into racks


def aligned_placement_exists(rack_size: int, broken: tuple[frozenset[int], ...], sizes: tuple[int, ...]) -> bool:
    """Brute force: every stage (a power of two) into an aligned block of free accelerators."""

    @cache
    def go(i: int, used: tuple[frozenset[int], ...]) -> bool:
        if i == len(sizes):
            return True
        s = sizes[i]
        for r, taken in enumerate(used):
            for k in range(rack_size // s):
                block = frozenset(range(k * s, (k + 1) * s))
                if not block & taken and not block & broken[r] and go(i + 1, used[:r] + (taken | block,) + used[r + 1:]):
                    return True
        return False

    return go(0, tuple(frozenset() for _ in broken))


@settings(max_examples=200, deadline=None)
@given(rack_size=st.sampled_from([4, 8, 16]), data=st.data())
def test_stage_packing_around_broken_accelerators_matches_brute_force(rack_size, data):
    n_racks = data.draw(st.integers(1, 3))
    broken = tuple(frozenset(data.draw(st.sets(st.integers(0, rack_size - 1), max_size=3))) for _ in range(n_racks))
    sizes = tuple(sorted(data.draw(st.lists(st.sampled_from([s for s in (1, 2, 4, 8) if s < rack_size or s == 4]),
                                            min_size=1, max_size=7)), reverse=True))
    items = [StageItem(("s", i), size, ("replica", i // 2)) for i, size in enumerate(sizes)]
    racks = [RackSlots(f"r#{r}", rack_size, [i not in broken[r] for i in range(rack_size)]) for r in range(n_racks)]
    expected = aligned_placement_exists(rack_size, broken, sizes)
    try:
        assignment = place(racks, items)
    except PlacementFailed:
        assert not expected
        return
    assert expected
    seen = set()
    for item in items:
        ((r, start),) = assignment[item.key]
        assert start % item.size == 0  # aligned
        block = {(r, i) for i in range(start, start + item.size)}
        assert not block & seen, "an accelerator used twice"
        assert not any(i in broken[r] for _, i in block), "a broken accelerator used"
        seen |= block


def test_replicas_stay_in_one_rack_when_a_rack_can_hold_them():
    # three boxes of 8, one GPU down in the second; five replicas of two 2-GPU stages
    racks = [RackSlots(f"b#{r}", 8, [not (r == 1 and i == 5) for i in range(8)]) for r in range(3)]
    items = [StageItem((rep, s), 2, (rep,)) for rep in range(5) for s in range(2)]
    assignment = place(racks, items)
    for rep in range(5):
        assert assignment[(rep, 0)][0][0] == assignment[(rep, 1)][0][0], f"replica {rep} split over racks"


# ---------------------------------------------------------------------------------------------
# experts onto ranks


class _Arch:
    """The parts of a model the expert placement reads."""

    def __init__(self, n_experts: int, n_layers: int = 1):
        self.moe = type("Moe", (), {"n_routed_experts": n_experts})()
        self.layer_is_moe = (True,) * n_layers
        self.n_layers = n_layers
        self.n_moe_layers = n_layers


def brute_force_min_max(loads: list[float], copies: list[int], n_ranks: int, slots: int) -> float:
    """Smallest possible max rank load: every copy of expert e carries loads[e]/copies[e], copies of
    one expert on different ranks, `slots` per rank."""
    items = [(loads[e] / copies[e], e) for e in range(len(loads)) for _ in range(copies[e])]
    best = float("inf")
    for assignment in itertools.product(range(n_ranks), repeat=len(items)):
        count = [0] * n_ranks
        load = [0.0] * n_ranks
        holds = [set() for _ in range(n_ranks)]
        ok = True
        for (w, e), r in zip(items, assignment, strict=True):
            if e in holds[r] or count[r] == slots:
                ok = False
                break
            holds[r].add(e)
            count[r] += 1
            load[r] += w
        if ok:
            best = min(best, max(load))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_expert_placement_matches_brute_force_on_small_layers(seed):
    rng = np.random.default_rng(seed)
    loads = rng.lognormal(0, 0.9, size=6)
    arch = _Arch(6)
    ours = place_experts(arch, loads[None, :], n_ranks=3, redundant_per_rank=1, method="cpsat", time_limit_s=5)
    (layer,) = ours.layers
    optimum = brute_force_min_max(list(loads), list(layer.copies), 3, 3)
    assert layer.max_load == pytest.approx(optimum, rel=1e-6)
    assert layer.lower_bound <= optimum * (1 + 1e-12)


def _assert_valid(placement, loads, n_experts):
    for layer, row in zip(placement.layers, loads, strict=True):
        held = [e for rank in layer.slots for e in rank]
        assert sorted(set(held)) == list(range(n_experts)), "every expert placed"
        assert all(len(rank) == placement.slots_per_rank and len(set(rank)) == len(rank) for rank in layer.slots)
        copies = np.bincount(held, minlength=n_experts)
        recomputed = [sum(row[e] / copies[e] for e in rank) for rank in layer.slots]
        assert np.allclose(recomputed, layer.rank_loads)
        assert sum(layer.rank_loads) == pytest.approx(row.sum())  # copies split an expert's load


@pytest.mark.parametrize(("model", "ranks"), [("deepseek-v3", 64), ("kimi-k2", 96)])
def test_expert_placement_beats_the_eplb_baseline_on_skewed_loads(models, model, ranks):
    arch = models[model]
    loads = synthetic_profile(arch, sigma=0.9, seed=1)[:6]
    arch6 = _Arch(arch.moe.n_routed_experts, 6)
    ours = place_experts(arch6, loads, ranks, redundant_per_rank=1)
    baseline = eplb_baseline(arch6, loads, ranks, redundant_per_rank=1)
    _assert_valid(ours, loads, arch.moe.n_routed_experts)
    _assert_valid(baseline, loads, arch.moe.n_routed_experts)
    assert all(a.max_load <= b.max_load + 1e-12 for a, b in zip(ours.layers, baseline.layers, strict=True))
    assert ours.worst_gap_to_bound < 0.01  # docs/cpsat.md section 6: greedy + swap within 0.4% of the bound


def brute_force_over_counts(loads: list[float], n_ranks: int, slots: int) -> dict[tuple[int, ...], float]:
    """For every replica count vector (1..n_ranks copies each, all slots used), the smallest max rank
    load over all placements: each expert's copies on a set of distinct ranks, `slots` per rank."""
    out = {}
    for copies in itertools.product(range(1, n_ranks + 1), repeat=len(loads)):
        if sum(copies) != n_ranks * slots:
            continue
        best = float("inf")
        for choice in itertools.product(*(itertools.combinations(range(n_ranks), c) for c in copies)):
            count, load = [0] * n_ranks, [0.0] * n_ranks
            for e, ranks in enumerate(choice):
                for r in ranks:
                    count[r] += 1
                    load[r] += loads[e] / copies[e]
            if max(count) <= slots:
                best = min(best, max(load))
        out[copies] = best
    return out


@pytest.mark.parametrize("s", [1.7, 1.8])
def test_replica_counts_reach_the_optimum_over_all_counts_on_a_small_zipf_layer(s):
    # 6 experts on 3 ranks of 3 slots, loads 1/k^s. EPLB's counts (3, 2, 1, 1, 1, 1) give the hottest
    # expert a copy on every rank; the optimum gives it two and splits the two coldest experts into fillers.
    loads = [1 / k**s for k in range(1, 7)]
    optimum = brute_force_over_counts(loads, 3, 3)
    best = min(optimum.values())
    assert min(optimum, key=optimum.get) == (2, 1, 1, 1, 2, 2)
    assert best < optimum[(3, 2, 1, 1, 1, 1)] * (1 - 0.01)  # EPLB's counts cannot get within 1% of it
    (layer,) = place_experts(_Arch(6), np.array([loads]), 3, 1).layers
    (eplb,) = eplb_baseline(_Arch(6), np.array([loads]), 3, 1).layers
    assert eplb.copies == (3, 2, 1, 1, 1, 1)
    assert layer.max_load == pytest.approx(best, rel=1e-9)


def test_capped_counts_give_the_spare_slots_to_the_coldest_experts():
    loads = np.array([8.0, 4.0, 2.0, 1.0, 0.5, 0.5])  # 3 ranks x 3 slots, mean rank load 16/3
    # cap 5: ceil(8/5) = 2 copies, the rest one each, 7 in all; two spare slots to experts 4 and 5
    assert capped_counts(loads, 5.0, 9, 3).tolist() == [2, 1, 1, 1, 2, 2]
    assert capped_counts(loads, 3.0, 9, 3).tolist() == [3, 2, 1, 1, 1, 1]  # 3 + 2 + 1 + 1 + 1 + 1 = 9
    assert capped_counts(loads, 2.0, 9, 3).tolist() == [3, 2, 1, 1, 1, 1]  # ceil(8/2) = 4 capped at 3 ranks
    assert capped_counts(loads, 1.9, 9, 3) is None  # 3 + 3 + 2 + 1 + 1 + 1 = 11 copies for 9 slots


def test_zipf_loads_come_within_two_percent_of_the_mean():
    # Zipf 1.4 over 128 experts on 32 ranks: the hottest expert carries ~36% of the load (~11.5 mean rank
    # loads); EPLB's counts put two copies near the mean rank load on some rank
    rng = np.random.default_rng(0)
    base = 1 / np.arange(1, 129) ** 1.4
    loads = np.stack([rng.permutation(base) for _ in range(3)])
    ours = place_experts(_Arch(128, 3), loads, 32, 1)
    baseline = eplb_baseline(_Arch(128, 3), loads, 32, 1)
    _assert_valid(ours, loads, 128)
    assert baseline.imbalance > 1.2
    assert all(layer.max_load <= 1.02 * layer.mean_load for layer in ours.layers)


@settings(max_examples=40, deadline=None)
@given(n_ranks=st.sampled_from([2, 3, 4, 8, 16]), base=st.integers(1, 4), redundant=st.integers(0, 2),
       shape=st.sampled_from(["lognormal", "zipf", "uniform", "zeros"]), seed=st.integers(0, 2**16))
def test_expert_placement_is_never_above_the_eplb_baseline(n_ranks, base, redundant, shape, seed):
    n_experts = n_ranks * base
    assume(base * n_ranks >= base + redundant)  # enough distinct experts to fill a rank
    rng = np.random.default_rng(seed)
    loads = {"lognormal": lambda: rng.lognormal(0, 1.5, size=(2, n_experts)),
             "zipf": lambda: np.stack([rng.permutation(1 / np.arange(1, n_experts + 1) ** 1.4) for _ in range(2)]),
             "uniform": lambda: np.ones((2, n_experts)),
             "zeros": lambda: rng.lognormal(0, 1, size=(2, n_experts)) * (rng.random((2, n_experts)) < 0.5) + 1e-3}[shape]()
    arch = _Arch(n_experts, 2)
    ours = place_experts(arch, loads, n_ranks, redundant)
    baseline = eplb_baseline(arch, loads, n_ranks, redundant)
    _assert_valid(ours, loads, n_experts)
    for a, b in zip(ours.layers, baseline.layers, strict=True):
        assert a.max_load <= b.max_load * (1 + 1e-12)
        assert a.lower_bound == pytest.approx(max(a.mean_load, max(w / c for w, c in zip(loads[a.layer], a.copies, strict=True))))


def test_expert_placement_is_deterministic():
    rng = np.random.default_rng(3)
    loads = np.vstack([np.stack([rng.permutation(1 / np.arange(1, 65) ** 1.4) for _ in range(2)]),
                       rng.lognormal(0, 0.9, size=(2, 64))])
    runs = [place_experts(_Arch(64, 4), loads, 16, 1) for _ in range(2)]
    assert [(p.slots, p.copies) for p in runs[0].layers] == [(p.slots, p.copies) for p in runs[1].layers]


def test_packing_finds_room_when_the_last_copies_meet_only_ranks_holding_them():
    # Longest-processing-time alone ends with both open slots on ranks that already hold expert 6
    # (it raised IndexError): a copy moves aside to make room.
    loads = np.array([1.91, 1.12, 0.6, 1.45, 3.69, 2.59, 0.5, 0.29])
    copies = np.array([1, 1, 3, 1, 1, 2, 2, 1])
    ranks = pack(loads, copies, 4, 3)
    assert all(len(rank) == 3 and len(set(rank)) == 3 for rank in ranks)
    assert np.bincount([e for rank in ranks for e in rank], minlength=8).tolist() == copies.tolist()


# ---------------------------------------------------------------------------------------------
# plans: placement in the JSON, check, export, view


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = {}
    for name in ("custom-cluster-degraded-hgx", "deepseek-v3-wide-ep-skewed", "llama-3.1-405b-pipeline"):
        resolved = resolve_problem(load_problem(data_dir("problems") / f"{name}.yaml"))
        record = solve_record(solve(resolved))
        path = tmp_path_factory.mktemp("plans") / f"{name}.json"
        path.write_text(json.dumps(record))
        out[name] = (resolved, record, path)
    return out


def test_custom_cluster_plan_avoids_the_failed_gpu_and_keeps_replicas_in_a_box(plans):
    resolved, record, _ = plans["custom-cluster-degraded-hgx"]
    assert check_plan(resolved, record, placement=True) == []
    used = [role["accelerator"] for d in record["deployments"] for role in d["placement"]]
    assert "hgx-h100#1/5" not in used and len(used) == len(set(used))
    for d in record["deployments"]:
        racks_of = {}
        for role in d["placement"]:
            racks_of.setdefault(role["replica"], set()).add(role["rack"])
        assert all(len(r) == 1 for r in racks_of.values())


def test_the_degraded_box_has_less_scale_up_bandwidth(plans):
    from planner.hardware.topology import (
        accelerator_nodes,
        build_cluster_graph,
        group_links,
    )

    resolved = plans["custom-cluster-degraded-hgx"][0]
    rack = resolved.hardware.racks["hgx-h100-3sw"]
    graph = build_cluster_graph([(rack, 1)], collective_latency_s=1e-5)
    # 13 of 18 NVLink 4 links remain: 4 + 4 + 5 links of 25 GB/s
    assert group_links(graph, accelerator_nodes(graph)).injection_bytes_per_s == pytest.approx(325e9)


def test_expert_maps_in_the_plan_are_complete_and_balanced(plans):
    resolved, record, _ = plans["deepseek-v3-wide-ep-skewed"]
    (d,) = record["deployments"]
    emap = d["expert_map"]
    assert emap["n_ranks"] == d["ep"] and emap["slots_per_rank"] == 256 // d["ep"] + 1
    assert len(emap["physical_to_logical_map"]) == 61  # one row per layer, dense ones trivial
    for layer in emap["layers"]:
        assert layer["max_load"] >= layer["lower_bound"] * (1 - 1e-12)
        assert layer["max_load"] / layer["mean_load"] < 1.01
    assert check_plan(resolved, record, placement=True) == []


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["placement"][1].update(accelerator=d["placement"][0]["accelerator"]), "already used"),
    (lambda d: d["placement"][0].update(accelerator="gb200-nvl72#7/0"), "not in the fleet"),
    (lambda d: d["placement"][0].update(tp_rank=5), "ranks (tp, dp, ep)"),
    (lambda d: d["placement"].pop(), "entries, replicas x accelerators"),
    (lambda d: d["expert_map"]["physical_to_logical_map"][5].__setitem__(0, d["expert_map"]["physical_to_logical_map"][5][1]),
     "not placed"),
    (lambda d: [r.update(layers=[0, 30]) for r in d["placement"]], "do not cover layers"),
])
def test_check_names_what_a_hand_edit_broke(plans, edit, message):
    resolved, record, _ = plans["deepseek-v3-wide-ep-skewed"]
    broken = json.loads(json.dumps(record))
    edit(broken["deployments"][0])
    problems = [str(v) for v in check_plan(resolved, broken, placement=True)]
    assert any(message in p for p in problems), problems


def test_check_cli_exit_codes(plans, tmp_path, capsys):
    _, record, path = plans["custom-cluster-degraded-hgx"]
    assert main(["check", str(path)]) == 0
    broken = json.loads(json.dumps(record))
    broken["deployments"][0]["placement"][0].update(accelerator="hgx-h100#1/5", rack="hgx-h100#1")  # the failed GPU
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    assert main(["check", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "'hgx-h100#1/5' is marked unavailable" in captured.out + captured.err
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["check", str(tmp_path / "junk.json")]) == 2


def test_placement_document_lists_every_accelerator_with_its_experts(plans):
    _, record, _ = plans["deepseek-v3-wide-ep-skewed"]
    doc = placement_document(record)
    assert doc["format"] == "llm-deployment-placement" and doc["format_version"] == 1
    (dep,) = doc["deployments"]
    entries = [a for replica in dep["replicas"] for a in replica["accelerators"]]
    assert len(entries) == record["deployments"][0]["accelerators"]
    slots = dep["expert_map"]["slots_per_rank"]
    first = entries[0]
    assert first["host"].endswith("/host0") and len(first["experts_per_layer"]["3"]) == slots  # layer 3: first MoE layer
    held = {e for a in entries for e in a["experts_per_layer"]["3"]}
    assert held == set(range(256))


def test_launch_scripts_use_each_engines_flags(plans):
    _, record, _ = plans["deepseek-v3-wide-ep-skewed"]
    d = record["deployments"][0]
    redundant = d["ep"]  # one redundant slot per rank
    vllm = export_plan(record, "vllm")
    assert "vllm serve deepseek-ai/DeepSeek-V3" in vllm and "--enable-expert-parallel" in vllm
    assert f"--data-parallel-size {d['dp_attn']}" in vllm and "--data-parallel-size-local 4" in vllm  # 4 GPUs per tray
    assert f'"num_redundant_experts": {redundant}' in vllm and "--kv-cache-dtype fp8" in vllm
    sglang = export_plan(record, "sglang")
    assert f"--ep-size {d['ep']}" in sglang and f"--attn-dp-size {d['dp_attn']}" in sglang and "--init-expert-location" in sglang
    assert f"--ep-num-redundant-experts {redundant}" in sglang and "physical_to_logical_map" in sglang
    trt = export_plan(record, "trtllm")
    assert f"--ep_size {d['ep']}" in trt and "enable_attention_dp: true" in trt
    assert f"num_slots: {256 + redundant}" in trt and "initial_global_assignments:" in trt
    pipeline = export_plan(plans["llama-3.1-405b-pipeline"][1], "vllm")
    assert "--pipeline-parallel-size" in pipeline


def test_export_and_view_cli(plans, tmp_path, capsys):
    _, _, path = plans["custom-cluster-degraded-hgx"]
    out = tmp_path / "placement.json"
    assert main(["export", str(path), "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == "llm-deployment-placement"
    assert main(["view", str(path)]) == 0
    text = capsys.readouterr().out
    # the box with the failed GPU shows it unavailable (x), and every rack of the fleet is drawn
    box = text.split("hgx-h100#1:")[1].split("hgx-h100#2:")[0]
    assert " x " in box and all(f"{r}:" in text for r in ("hgx-h100#0", "hgx-h100#2", "hgx-h100-3sw#0"))
    with pytest.raises(SystemExit) as exc:  # argparse names the allowed formats
        main(["export", str(path), "--format", "k8s"])
    assert exc.value.code == 2 and "choose from 'json', 'vllm', 'sglang', 'trtllm'" in capsys.readouterr().err
    before = path.read_bytes()
    assert main(["export", str(path), "--format", "json", "-o", str(path)]) == 2  # would replace the plan itself
    assert path.read_bytes() == before and "would replace it" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# re-placing experts of a deployment in service: moves and a move budget


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_max_overlap_assignment_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        overlap = rng.integers(0, 6, size=(n, n))
        perm = max_overlap_assignment(overlap)
        best = max(sum(overlap[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
        assert sorted(perm) == list(range(n)) and sum(overlap[i, perm[i]] for i in range(n)) == best


def _previous_map(placement, arch):
    return placement.physical_to_logical(arch)


def _drifted(loads, sigma, seed):
    return loads * np.random.default_rng(seed).lognormal(0, sigma, size=loads.shape)


def test_the_same_loads_again_move_nothing():
    arch = _Arch(64, 3)
    loads = np.random.default_rng(0).lognormal(0, 0.9, size=(3, 64))
    first = place_experts(arch, loads, 16, 1)
    # the same placement with its ranks shuffled is recognised: relabelling finds every copy in place
    rows = _previous_map(first, arch)
    shuffled = [reduce(operator.iadd, (row[r * 5:(r + 1) * 5] for r in np.random.default_rng(1).permutation(16)), []) for row in rows]
    again = place_experts(arch, loads, 16, 1, previous=shuffled)
    assert again.moves == 0 and again.imbalance == pytest.approx(first.imbalance)


@pytest.mark.parametrize("budget", [0, 4, 16])
def test_a_move_budget_is_kept_and_buys_balance(budget):
    arch = _Arch(64, 4)
    loads = np.random.default_rng(0).lognormal(0, 0.9, size=(4, 64))
    rows = _previous_map(place_experts(arch, loads, 16, 1), arch)
    drifted = _drifted(loads, 0.5, 1)
    free = place_experts(arch, drifted, 16, 1, previous=rows)
    capped = place_experts(arch, drifted, 16, 1, previous=rows, max_moves_per_layer=budget)
    _assert_valid(capped, drifted, 64)
    for layer, before in zip(capped.layers, rows, strict=True):
        held = [set(before[r * 5:(r + 1) * 5]) for r in range(16)]
        assert sum(len(set(rank) - h) for rank, h in zip(layer.slots, held, strict=True)) == layer.moves <= budget
    stay = place_experts(arch, drifted, 16, 1, previous=rows, max_moves_per_layer=0)
    assert free.imbalance <= capped.imbalance + 1e-12 <= stay.imbalance + 2e-12
    if budget:
        assert capped.imbalance < stay.imbalance  # a few moves already help
    assert free.moves > 16 * 4  # re-placing from scratch would move far more


def brute_force_min_max_with_budget(per_copy, copies, previous, slots, budget):
    """Smallest max rank load with each expert's copies on distinct ranks and at most `budget`
    copies on ranks that did not hold them before."""
    n_ranks, experts = len(previous), len(per_copy)
    best = float("inf")
    options = [list(itertools.combinations(range(n_ranks), int(copies[e]))) for e in range(experts)]
    for choice in itertools.product(*options):
        count = [0] * n_ranks
        load = [0.0] * n_ranks
        moves = 0
        for e, ranks in enumerate(choice):
            for r in ranks:
                count[r] += 1
                load[r] += per_copy[e]
                moves += e not in previous[r]
        if max(count) <= slots and moves <= budget:
            best = min(best, max(load))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_cpsat_with_a_move_budget_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    arch = _Arch(6)
    previous = [[0, 1, 2], [3, 4, 5], [0, 1, 3]]  # 3 ranks x 3 slots, experts 0, 1 and 3 twice
    loads = rng.lognormal(0, 0.9, size=(1, 6))
    placed = place_experts(arch, loads, 3, 1, method="cpsat", previous=[reduce(operator.iadd, previous, [])], max_moves_per_layer=1, time_limit_s=5)
    (layer,) = placed.layers
    copies = np.array(layer.copies)
    optimum = brute_force_min_max_with_budget(loads[0] / copies, copies, [set(r) for r in previous], 3, 1)
    assert layer.moves <= 1 and layer.max_load == pytest.approx(optimum, rel=1e-5)


def test_a_previous_plan_in_the_problem(tmp_path, plans):
    _, record, path = plans["deepseek-v3-wide-ep-skewed"]
    problem = json.loads(json.dumps(record["problem_spec"]))
    problem["placement"] |= {"previous_plan": str(path), "max_expert_moves_per_layer": 2,
                             "expert_load": {"synthetic": {"sigma": 1.0, "seed": 0}}}  # the loads drift: more skew
    resolved = resolve_problem(parse_problem(problem))
    result = solve(resolved)
    plan = solve_record(result)
    d = next(d for d in plan["deployments"] if d.get("expert_map"))
    emap = d["expert_map"]
    previous = next(p for p in record["deployments"] if p.get("expert_map"))
    assert d["ep"] == previous["ep"]  # the previous map applies
    assert all(layer["moves"] <= 2 for layer in emap["layers"]) and emap["moves"] > 0
    assert check_plan(resolved, plan, placement=True) == []
    # a hand edit that moves more than the budget is caught
    row = emap["physical_to_logical_map"][3]
    emap["physical_to_logical_map"][3] = row[-emap["slots_per_rank"]:] + row[:-emap["slots_per_rank"]]
    assert any("max_expert_moves_per_layer is 2" in str(v) for v in check_plan(resolved, plan, placement=True))


def test_previous_plan_mistakes_name_the_field(tmp_path):
    from planner.errors import PlannerInputError

    base = {"name": "x", "model": "deepseek-v3", "cluster": {"racks": [{"type": "gb200-nvl72", "count": 1}]},
            "workloads": [{"name": "w", "input_tokens": 1000, "output_tokens": 100, "tpot_limit_ms": 50}]}
    with pytest.raises(PlannerInputError, match="placement.previous_plan"):
        resolve_problem(parse_problem(base | {"placement": {"previous_plan": str(tmp_path / "missing.json")}}))
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(PlannerInputError, match="not a plan written by"):
        resolve_problem(parse_problem(base | {"placement": {"previous_plan": str(tmp_path / "junk.json")}}))
    with pytest.raises(PlannerInputError, match="give placement.previous_plan"):
        parse_problem(base | {"placement": {"max_expert_moves_per_layer": 3}})
    # read through a typed view of the plan: a wrong-typed map names where in the file it is wrong
    broken = {"deployments": [{"model": "deepseek-v3", "expert_map": {"n_ranks": "eight", "slots_per_rank": 33,
                                                                      "physical_to_logical_map": [[0]]}}]}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(PlannerInputError, match=r"deployments\.0\.expert_map\.n_ranks"):
        resolve_problem(parse_problem(base | {"placement": {"previous_plan": str(tmp_path / "broken.json")}}))


def test_plans_load_through_the_typed_plan(plans, tmp_path, capsys):
    """check, export and view load a plan through its pydantic model: a hand edit that breaks the
    structure (a fractional replica index) or a plan of another format version is refused with the
    field and the fix (exit 2) before any reader runs, and `planner schema --plan` prints the schema."""
    _, record, _ = plans["custom-cluster-degraded-hgx"]
    bad = json.loads(json.dumps(record))
    bad["deployments"][0]["placement"][0]["replica"] = 0.5
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    for command in ("check", "view", "export"):
        assert main([command, str(path)]) == 2
        assert "deployments[0].placement[0].replica" in " ".join(capsys.readouterr().err.split())
    newer = json.loads(json.dumps(record)) | {"format_version": 2}
    path.write_text(json.dumps(newer))
    assert main(["check", str(path)]) == 2
    assert "version 2 is not supported" in " ".join(capsys.readouterr().err.split())  # the message wraps at the terminal's width
    assert main(["schema", "--plan"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"deployments", "problem_spec", "format_version"} <= set(schema["properties"])


def test_more_redundant_copies_than_a_rank_can_hold_are_dropped_not_a_crash():
    # Mixtral (8 experts) on EP8 with 64 redundant copies per rank asks for 65 slots per rank; a rank
    # holds each expert at most once, so 8 slots per rank (every expert on every rank) is the most.
    from planner.model.catalog import load_model_catalog

    arch = load_model_catalog()["mixtral-8x7b"]
    loads = np.ones((arch.n_moe_layers, 8))
    placement = place_experts(arch, loads, 8, 64)
    assert placement.slots_per_rank == 8
    assert placement.imbalance == pytest.approx(1.0)


def test_group_limited_routing_keeps_every_expert_group_inside_one_domain():
    # DeepSeek-V3 picks 4 of 8 groups (contiguous blocks of 32 experts) per token; with each group's
    # experts and copies inside one 8-GPU domain, a token reaches at most 4 domains. DeepSeek's EPLB
    # places hierarchically exactly when the groups split evenly over the nodes.
    from planner.model.catalog import load_model_catalog
    from planner.placement.groups import groups_fit_nodes, place_layer_by_groups

    assert groups_fit_nodes(256, 8, 4, 64, 8) and groups_fit_nodes(256, 8, 4, 32, 8)
    assert not groups_fit_nodes(256, 8, 4, 48, 8)   # 6 domains do not split 8 groups
    assert not groups_fit_nodes(256, 8, 4, 8, 8)    # one domain: nothing to keep local
    assert not groups_fit_nodes(384, 1, 1, 96, 8)   # Kimi K2 routes without groups
    assert not groups_fit_nodes(256, 8, 4, 64, None)

    arch = load_model_catalog()["deepseek-v3"]
    placement = place_experts(arch, np.ones((arch.n_moe_layers, 256)), 64, 1, ranks_per_node=8)
    assert placement.imbalance == pytest.approx(1.0)  # even loads: groups and copies balance exactly
    for layer in placement.layers:
        domains_of_group = {}
        for rank, experts in enumerate(layer.slots):
            for e in experts:
                domains_of_group.setdefault(e // 32, set()).add(rank // 8)
        assert all(len(d) == 1 for d in domains_of_group.values())

    # a skewed layer: one group per domain, so the hottest domain carries its group's whole load, and
    # the search inside the domain spreads it over the 8 ranks (5 slots each) to within 2%
    loads = np.random.default_rng(3).lognormal(0.0, 0.9, 256)
    copies, ranks = place_layer_by_groups(loads, 64, 5, 8, 8, 1.0, float("inf"))
    rank_loads = [sum(loads[e] / copies[e] for e in rank) for rank in ranks]
    hottest_group_per_rank = loads.reshape(8, 32).sum(axis=1).max() / 8
    assert hottest_group_per_rank * (1 - 1e-9) <= max(rank_loads) <= hottest_group_per_rank * 1.02
    assert {e for rank in ranks for e in rank} == set(range(256)) and all(len(set(r)) == len(r) for r in ranks)


def test_groups_are_kept_whole_only_when_that_costs_no_balance():
    # Keeping groups per domain saves NIC copies in prefill only; on skewed loads one group per domain
    # leaves a hot domain (1.31x on this profile), so the flat placement is kept and the step model
    # is told a token's experts may sit in any domain.
    from planner.model.catalog import load_model_catalog
    from planner.placement.groups import expert_groups_local, grouping_is_free

    arch = load_model_catalog()["deepseek-v3"]
    even = np.ones((2, 256))
    skewed = synthetic_profile(arch, sigma=0.9, seed=0)
    assert grouping_is_free(even, 8, 8) and not grouping_is_free(skewed, 8, 8)
    placement = place_experts(arch, skewed, 64, 1, ranks_per_node=8)
    layers = [[list(r) for r in layer.slots] for layer in placement.layers]
    assert not expert_groups_local(arch, 64, 8, layers)
    assert placement.imbalance < 1.01  # the flat search's balance, not a hot domain's
    assert expert_groups_local(arch, 8, 8, layers)  # inside one domain nothing crosses the NICs anyway


def test_group_local_experts_cut_the_prefill_exchange_across_domains():
    # DeepSeek-V3 at EP64 over eight 8-GPU H100 domains, SGLang prefill (DeepEP normal mode: one copy
    # per domain a token reaches): 4 domains per token with whole groups per domain against
    # 8 (1 - (7/8)^8) = 5.25 otherwise, so the same pass is faster with the groups kept local.
    from dataclasses import replace

    from planner.cli.estimate import estimate_inputs
    from planner.cli.parser import build_parser
    from planner.physics.estimate import estimate

    args = build_parser().parse_args(["estimate", "--model", "deepseek-v3", "--rack", "hgx-h100", "--ep", "64", "--batch", "512",
                                      "--isl", "2048", "--osl", "1", "--role", "prefill", "--engine", "sglang",
                                      "--weights-precision", "fp8", "--kv-precision", "fp8"])
    base = estimate_inputs(args)
    assert base.expert_groups_local  # estimate assumes an engine's contiguous, group-aligned default
    local, spread = estimate(base), estimate(replace(base, expert_groups_local=False))
    assert local.prefill_latency_s < spread.prefill_latency_s
    # the saving is at most the exchange's share: fewer NIC copies, nothing else changes
    assert spread.prefill_latency_s - local.prefill_latency_s < spread.prefill_latency_s * (1 - 4 / 5.25)


def test_enumeration_takes_group_locality_from_the_placement_it_measures():
    # DeepSeek-V3 over four 8-GPU H100 boxes, expert-parallel groups allowed to span them. With a
    # skewed profile the placement keeps the flat search (one group per domain leaves a hot domain),
    # so a wide layout's exchange may reach any domain; with even loads the groups stay whole. The
    # enumerated candidates say the same as an independent placement at their width, with as many
    # ranks per box as the final placement puts there: 8 x EP / stage size (an expert rank of
    # stage size / EP accelerators), at least one.
    from planner.model.catalog import load_model_catalog
    from planner.placement.groups import expert_groups_local
    from planner.solver.solve import prepare

    arch = load_model_catalog()["deepseek-v3"]
    for distribution, spread_expected in (("lognormal", True), ("uniform", False)):
        raw = {"model": {"catalog": "deepseek-v3", "expert_load": {"synthetic": {"distribution": distribution}}},
               "precisions": {"weights": "fp8", "kv_cache": "fp8"},
               "cluster": {"racks": [{"type": "hgx-h100", "count": 4}], "allow_spanning_domains": True},
               "workloads": [{"name": "chat", "input_tokens": 2048, "output_tokens": 256, "tpot_limit_ms": 100}]}
        resolved = resolve_problem(parse_problem(raw))
        _, analyses = prepare(resolved)
        wide = [c for c in analyses[("chat", "hgx-h100")].candidates if c.layout.ep > 1 and c.layout.stage_size > 8]
        assert any(c.layout.ep > 8 for c in wide), "no expert-parallel layout spans two boxes"
        assert any(c.layout.stage_size != c.layout.ep for c in wide), "no expert rank of several accelerators"
        for c in wide:
            loads = next(iter(resolved.models.values())).expert_loads
            per_box = max(1, 8 * c.layout.ep // c.layout.stage_size)
            placement = place_experts(arch, loads, c.layout.ep, 0, ranks_per_node=per_box)
            local = expert_groups_local(arch, c.layout.ep, per_box, [[list(r) for r in layer.slots] for layer in placement.layers])
            assert c.inputs.expert_groups_local == local == (not spread_expected), (c.layout, distribution)
