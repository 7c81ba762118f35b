"""Accelerator and rack catalog, and bandwidths read from cluster graphs."""

import pytest

from planner.errors import PlannerInputError
from planner.hardware.specs import AcceleratorSpec, RackSpec
from planner.hardware.topology import (
    accelerator_nodes,
    build_cluster_graph,
    group_links,
    group_to_group_bandwidth_bytes_per_s,
    scale_up_domains,
)

REQUIRED_ACCELERATORS = ["h100-sxm", "h200-sxm", "b200", "b300", "gb200", "gb300", "rubin", "rubin-ultra", "tpu-v5e",
                         "tpu-v5p", "tpu-v6e", "tpu-v7", "mi300x", "mi325x", "mi355x", "trainium2"]
REQUIRED_RACKS = ["hgx-h100", "hgx-h200", "hgx-b200", "hgx-b300", "gb200-nvl72", "gb300-nvl72", "vr-nvl144",
                  "rubin-ultra-nvl576", "tpu-v5e-256", "tpu-v5p-64", "tpu-v6e-256", "tpu-v7-64", "mi300x-8", "mi325x-8",
                  "mi355x-8", "trn2-16"]


def test_catalog_has_every_required_part(hw):
    assert set(REQUIRED_ACCELERATORS) <= set(hw.accelerators)
    assert set(REQUIRED_RACKS) <= set(hw.racks)


def test_catalog_values_are_si(hw):
    h100 = hw.accelerators["h100-sxm"]
    assert h100.hbm_capacity_bytes == 81_559 * 2**20  # nvidia-smi memory.total, not the datasheet's "80 GB"
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h100.dense_flops_per_s["bf16"] == 989.5e12
    assert h100.scale_up_bandwidth_bytes_per_s == 450e9 and h100.scale_out_bandwidth_bytes_per_s == 50e9
    assert h100.compute_fraction_by_format["bf16"] == 0.803  # MAMF 794.5 / 989
    assert hw.accelerators["tpu-v7"].compute_fraction_by_format["bf16"] == 0.75  # documented default


def test_every_accelerator_number_has_a_source(hw):
    for accel in hw.accelerators.values():
        for name in ("hbm_capacity_gb", "hbm_bandwidth_tb_per_s", "dense_tflop_per_s", "scale_up_gb_per_s",
                     "scale_out_gb_per_s", "price_usd_per_hour"):
            assert accel.sources.get(name), (accel.id, name)


def _spec(**changes):
    base = {"id": "x1", "name": "X", "vendor": "V", "hbm_capacity_gb": 80, "hbm_bandwidth_tb_per_s": 3.0,
                "dense_tflop_per_s": {"bf16": 1000}, "scale_up_gb_per_s": 450, "scale_out_gb_per_s": 50,
                "price_usd_per_hour": 2.0, "price_basis": "test",
                "sources": {k: "DERIVED" for k in ("hbm_capacity_gb", "hbm_bandwidth_tb_per_s", "dense_tflop_per_s",
                                                "scale_up_gb_per_s", "scale_out_gb_per_s", "price_usd_per_hour")}}
    base.update(changes)
    return base


def test_a_number_without_source_is_refused():
    spec = _spec()
    spec["sources"] = {k: v for k, v in spec["sources"].items() if k != "hbm_capacity_gb"}
    with pytest.raises(ValueError, match="hbm_capacity_gb"):
        AcceleratorSpec(**spec)


def test_wrong_units_are_caught():
    with pytest.raises(ValueError, match="looks like GB/s or bytes/s"):
        AcceleratorSpec(**_spec(hbm_bandwidth_tb_per_s=3.35e12))
    with pytest.raises(ValueError, match="looks like bytes/s"):
        AcceleratorSpec(**_spec(scale_up_gb_per_s=450e9))


def test_overrides_from_a_problem(hw):
    custom = AcceleratorSpec(**_spec())
    rack = RackSpec(id="x1-4", name="four X", accelerator="x1", accelerators=4, scale_up={"kind": "switched"})
    catalog = hw.with_overrides(accelerators=[custom], racks=[rack], price_usd_per_hour={"h100-sxm": 1.5},
                                achievable={"h100-sxm": {"hbm_bandwidth_fraction": 0.9}})
    assert catalog.racks["x1-4"].accelerator.hbm_bandwidth_bytes_per_s == 3e12
    assert catalog.racks["hgx-h100"].accelerator.price_usd_per_hour == 1.5
    assert catalog.racks["hgx-h100"].accelerator.hbm_bandwidth_fraction == 0.9
    with pytest.raises(PlannerInputError, match="did you mean 'h100-sxm'"):
        hw.with_overrides(price_usd_per_hour={"h100": 1.0})


def _graph(hw, rack_id, count=2):
    return build_cluster_graph([(hw.racks[rack_id], count)], collective_latency_s=hw.overheads.collective_latency_s)


def test_scale_up_domains_come_from_the_graph(hw):
    graph = _graph(hw, "hgx-h100", 3)
    assert [len(d) for d in scale_up_domains(graph)] == [8, 8, 8]
    assert [len(d) for d in scale_up_domains(_graph(hw, "gb200-nvl72", 1))] == [72]
    assert [len(d) for d in scale_up_domains(_graph(hw, "tpu-v5e-256", 1))] == [256]


def test_switched_group_bandwidth(hw):
    graph = _graph(hw, "hgx-h100")
    nodes = accelerator_nodes(graph)
    inside = group_links(graph, nodes[:8])
    assert inside.link_kind == "scale_up" and inside.injection_bytes_per_s == 450e9  # 18 NVLink4 x 25 GB/s
    assert inside.bisection_bytes_per_s == 4 * 450e9
    spanning = group_links(graph, nodes[4:12])
    assert spanning.spans_domains and spanning.link_kind == "scale_out"
    assert spanning.injection_bytes_per_s == 50e9  # one 400 Gb/s NIC per GPU


def test_full_mesh_pairs_get_one_link(hw):
    graph = _graph(hw, "mi300x-8", 1)
    nodes = accelerator_nodes(graph)
    assert group_links(graph, nodes[:2]).injection_bytes_per_s == pytest.approx(448e9 / 7)  # 64 GB/s per peer
    assert group_links(graph, nodes[:8]).injection_bytes_per_s == pytest.approx(448e9)


def test_torus_bisection(hw):
    v5e = _graph(hw, "tpu-v5e-256", 1)
    row = accelerator_nodes(v5e)[:16]  # one ring of 16 chips, 45 GB/s per link and direction
    links = group_links(v5e, row)
    assert links.injection_bytes_per_s == pytest.approx(2 * 45e9)
    assert links.bisection_bytes_per_s == pytest.approx(2 * 45e9)  # halving a ring cuts two links
    cube = _graph(hw, "tpu-v7-64", 1)
    # 4x4x4 with wraparound: halving along x cuts the 16 x-rings twice; 100 GB/s per link (600 / 6)
    assert group_links(cube, accelerator_nodes(cube)).bisection_bytes_per_s == pytest.approx(32 * 100e9)


def test_group_to_group_bandwidth(hw):
    graph = _graph(hw, "hgx-h100")
    nodes = accelerator_nodes(graph)
    assert group_to_group_bandwidth_bytes_per_s(graph, nodes[0:4], nodes[4:8]) == pytest.approx(4 * 450e9)
    assert group_to_group_bandwidth_bytes_per_s(graph, nodes[0:4], nodes[8:12]) == pytest.approx(4 * 50e9)


def test_unavailable_accelerators_are_left_out(hw):
    graph = build_cluster_graph([(hw.racks["hgx-h100"], 1)], collective_latency_s=1e-5, unavailable=["hgx-h100#0/3"])
    assert "hgx-h100#0/3" not in accelerator_nodes(graph) and len(accelerator_nodes(graph)) == 7


def test_a_custom_cluster_needs_no_code(hw):
    spec = RackSpec(id="ring-6", name="six on a ring", accelerator="h100-sxm", accelerators=6,
                    scale_up={"kind": "torus", "dims": [6], "wraparound": True})
    catalog = hw.with_overrides(racks=[spec])
    graph = build_cluster_graph([(catalog.racks["ring-6"], 1)], collective_latency_s=1e-5)
    links = group_links(graph, accelerator_nodes(graph))
    assert links.injection_bytes_per_s == pytest.approx(450e9)  # two ring links of 225 GB/s
    assert links.bisection_bytes_per_s == pytest.approx(2 * 225e9)


def _two_boards_spec(bridge_gb_per_s=100.0):
    """Two 4-GPU boards, each a full mesh of 150 GB/s links, joined by one bridge link 3 <-> 4."""
    links = [{"a": a, "b": b, "gb_per_s": 150} for board in (0, 4) for a in range(board, board + 4)
             for b in range(a + 1, board + 4)]
    links.append({"a": 3, "b": 4, "gb_per_s": bridge_gb_per_s})
    return RackSpec(id="two-boards", name="two boards with a bridge", accelerator="h100-sxm", accelerators=8,
                    scale_up={"kind": "links", "links": links})


def test_explicit_links_set_the_bandwidths(hw):
    catalog = hw.with_overrides(racks=[_two_boards_spec()])
    graph = build_cluster_graph([(catalog.racks["two-boards"], 1)], collective_latency_s=1e-5)
    nodes = accelerator_nodes(graph)
    assert [len(d) for d in scale_up_domains(graph)] == [8]  # one domain, bridged
    board = group_links(graph, nodes[:4])
    assert board.injection_bytes_per_s == pytest.approx(3 * 150e9)
    assert board.bisection_bytes_per_s == pytest.approx(4 * 150e9)  # {0,1} -> {2,3}: four links
    whole = group_links(graph, nodes)
    assert not whole.spans_domains
    assert whole.bisection_bytes_per_s == pytest.approx(100e9)  # the bridge is the cut
    assert group_to_group_bandwidth_bytes_per_s(graph, nodes[:4], nodes[4:]) == pytest.approx(100e9)


def test_explicit_two_level_switch_tree(hw):
    # 8 GPUs, two leaf switches of four, leaves joined to one spine by 200 GB/s each
    links = [{"a": i, "b": "leaf0" if i < 4 else "leaf1", "gb_per_s": 400} for i in range(8)]
    links += [{"a": "leaf0", "b": "spine", "gb_per_s": 200}, {"a": "leaf1", "b": "spine", "gb_per_s": 200}]
    spec = RackSpec(id="tree-8", name="switch tree", accelerator="h100-sxm", accelerators=8,
                    scale_up={"kind": "links", "switches": ["leaf0", "leaf1", "spine"], "links": links})
    graph = build_cluster_graph([(hw.with_overrides(racks=[spec]).racks["tree-8"], 1)], collective_latency_s=1e-5)
    nodes = accelerator_nodes(graph)
    assert group_links(graph, nodes[:4]).bisection_bytes_per_s == pytest.approx(2 * 400e9)
    assert group_links(graph, nodes).bisection_bytes_per_s == pytest.approx(200e9)  # oversubscribed spine


@pytest.mark.parametrize(("links", "switches", "message"), [
    ([{"a": 0, "b": 9, "gb_per_s": 1}], [], r"links\[0\]\.b = 9 is not an accelerator index"),
    ([{"a": 0, "b": "sw", "gb_per_s": 1}], [], r"'sw' is not a switch of this unit"),
    ([{"a": 0, "b": 1, "gb_per_s": 1}], [], r"accelerators \[2, 3\] are not linked"),
    ([{"a": 1, "b": 1, "gb_per_s": 1}], [], "joins 1 to itself"),
])
def test_bad_explicit_links_are_named(links, switches, message):
    with pytest.raises(ValueError, match=message):
        RackSpec(id="bad", name="bad", accelerator="h100-sxm", accelerators=4,
                 scale_up={"kind": "links", "switches": switches, "links": links})


def test_block_quantised_fp8_weights_shard_only_into_whole_blocks(models):
    """Qwen3-235B's fp8 checkpoint scales 128 x 128 blocks: its 1,536-wide experts cut 8 ways leave
    192 columns (1.5 blocks), which engines refuse; 4 ways leave 384 (3 blocks). DeepSeek-V3's
    2,048-wide experts split 16 ways keep 128 (one block) but 32 ways leave 64, and its 18,432-wide dense
    MLP leaves 576 (4.5 blocks). bf16 weights have no blocks."""
    from planner.physics.deployment import Layout, Precisions, quantization_issues
    from planner.precision import FlopsFormat, Precision

    fp8 = Precisions(Precision.FP8, Precision.BF16, Precision.BF16, FlopsFormat.FP8)
    bf16 = Precisions(Precision.BF16, Precision.BF16, Precision.BF16, FlopsFormat.BF16)
    qwen, ds = models["qwen3-235b-a22b"], models["deepseek-v3"]
    assert [i.field for i in quantization_issues(qwen, Layout(tp=8, ep=1, pp=1, dp_attn=1), fp8)] == ["layout.expert_tp"]
    assert quantization_issues(qwen, Layout(tp=4, ep=1, pp=1, dp_attn=1), fp8) == []
    assert quantization_issues(qwen, Layout(tp=8, ep=1, pp=1, dp_attn=1), bf16) == []
    assert quantization_issues(ds, Layout(tp=16, ep=1, pp=1, dp_attn=1), fp8) == []
    assert [i.field for i in quantization_issues(ds, Layout(tp=32, ep=1, pp=1, dp_attn=1), fp8)] == ["layout.tp", "layout.expert_tp"]
