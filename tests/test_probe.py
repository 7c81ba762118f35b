"""`planner probe --smoke` end to end on the CPU: tiny shapes measured with PyTorch, written as kernel
tables, fitted by `planner calibrate` into a user catalog under a new accelerator key, and planned
with by `planner estimate` (by flag and from a problem file), for a catalog part and for a part
outside the catalog defined in a problem file. Skipped where PyTorch is absent (.ci/run installs its
CPU build)."""

import hashlib
import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch", reason="planner probe needs PyTorch: .ci/run installs the CPU build (pip install torch==2.13.0)")
pytest.importorskip("pandas", reason="the probe writes parquet tables (pandas, pyarrow)")
pytest.importorskip("pyarrow", reason="the probe writes parquet tables (pandas, pyarrow)")
pd = pytest.importorskip("pandas")

from planner.cli.main import main
from planner.paths import data_dir

TABLES = ("gemm/gemm_perf.parquet", "moe/moe_perf.parquet", "attention/generation_attention_perf.parquet",
          "attention/context_attention_perf.parquet", "mla/generation_mla_perf.parquet", "mla/context_mla_perf.parquet",
          "elementwise/elementwise_perf.parquet", "mem/mem_perf.parquet", "step/decode_step_perf.parquet")
CLASSES = ("gemm", "moe", "attention_decode", "attention_prefill", "mla_decode", "mla_prefill", "elementwise")
CUSTOM = {"id": "acme-x1", "name": "ACME X1 96GB", "vendor": "ACME", "hbm_capacity_gb": 96, "hbm_bandwidth_tb_per_s": 3.2,
          "dense_tflop_per_s": {"bf16": 600}, "scale_up_gb_per_s": 200, "scale_out_gb_per_s": 50, "price_usd_per_hour": 1.5,
          "price_basis": "a made-up part for this test",
          "sources": {k: "PROJECT_ESTIMATE" for k in ("hbm_capacity_gb", "hbm_bandwidth_tb_per_s", "dense_tflop_per_s", "scale_up_gb_per_s",
                                                      "scale_out_gb_per_s", "price_usd_per_hour")}}


def _shipped_digest() -> str:
    return hashlib.sha256((data_dir("topologies") / "kernels.yaml").read_bytes()).hexdigest()


QWEN3_MOE = {  # a config.json: Qwen3-30B-A3B's shapes (128 experts of 768, 8 per token, hidden 2048)
    "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "vocab_size": 151936, "head_dim": 128,
    "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "max_position_embeddings": 40960, "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("probe")
    config = tmp_path_factory.mktemp("models") / "qwen3-moe.json"
    config.write_text(json.dumps(QWEN3_MOE))
    assert main(["probe", "llama-3.1-8b", str(config), "--smoke", "--out", str(out), "--budget-s", "2"]) == 0
    return out


def test_smoke_probe_measures_every_class_and_records_the_machine(probed):
    record = yaml.safe_load((probed / "probe.yaml").read_text())
    assert record["probe"]["device_type"] == "cpu" and record["probe"]["libraries"]["torch"].startswith("2.")
    assert record["run"]["smoke"] is True and record["run"]["models"] == ["llama-3.1-8b", "qwen3-moe"]
    experts = pd.read_parquet(next((probed / "probe" / "moe").rglob("moe_perf.parquet")))
    # the config's experts, not the reference model's: smoke widths are /64 (2048 -> 32, 768 -> 12), experts /8 (128 -> 16);
    # first the three floor shapes: min(128, 32, 12) = 12 wide, one of the 16 experts per rank, 1, 2 and 4 tokens
    floor, layers = experts[experts["moe_ep_size"] == 16], experts[experts["moe_ep_size"] < 16]
    assert sorted(floor["num_tokens"]) == [1, 2, 4] and set(floor["hidden_size"]) == set(floor["inter_size"]) == {12}
    assert set(layers["hidden_size"]) == {32} and set(layers["inter_size"]) == {12} and set(experts["num_experts"]) == {16}
    assert set(layers["moe_tp_size"]) == {1, 8}  # whole experts, and split 8 ways
    for table in TABLES:  # calibrate fits a kernel table of 8 shapes or more, a copy or elementwise table of 4
        assert record["run"]["rows"][table] >= (4 if table.startswith(("mem", "elementwise")) else 6 if table.startswith("step") else 8), table
    assert "collectives" in record["run"]["not_measured"]  # one CPU process: nothing to communicate with


def _estimate(tmp_path: Path, name: str, *args: str) -> dict:
    path = tmp_path / f"{name}.json"
    assert main(["estimate", *args, "--batch", "4", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_calibrated_probe_is_a_new_key_estimate_can_name(probed, tmp_path, capsys):
    shipped = _shipped_digest()
    catalog = tmp_path / "catalog"
    assert main(["calibrate", str(probed), "--out", str(catalog), "--accelerator", "h200-sxm"]) == 0
    assert _shipped_digest() == shipped
    assert "decode step, probed h200-sxm-probed over shipped h200-sxm vllm curves" in capsys.readouterr().out
    assert main(["calibrate", str(probed), "--out", str(tmp_path / "other"), "--accelerator", "h200-sxm", "--name", "h100-sxm"]) == 2
    assert "h100-sxm is an accelerator of the shipped catalog" in capsys.readouterr().err  # a shipped id is not a new key
    kernels = yaml.safe_load((catalog / "kernels.yaml").read_text())
    engine = kernels["accelerators"]["h200-sxm-probed"]["engines"]["vllm"]
    assert set(CLASSES) <= set(engine) and kernels["source"]["package"] == "planner probe"
    probed_run = _estimate(tmp_path, "probed", "--kernel-catalog", str(catalog), "--rack", "h200-sxm-probed-hgx-h200", "--model", "llama-3.1-8b")
    shipped_run = _estimate(tmp_path, "shipped", "--rack", "hgx-h200", "--model", "llama-3.1-8b")
    assert probed_run["accelerator"] == "h200-sxm-probed" and probed_run["kernel_source"].startswith("planner probe")
    assert shipped_run["kernel_source"].startswith("aiconfigurator-core")
    # one CPU core streams memory hundreds of times slower than an H200's 4.8 TB/s: the probed step is slower
    assert probed_run["decode_only_step_time_s"]["total"] > 10 * shipped_run["decode_only_step_time_s"]["total"]


def test_a_part_outside_the_catalog_plans_with_its_probed_rates(probed, tmp_path):
    parts = tmp_path / "parts.yaml"
    parts.write_text(yaml.safe_dump({"name": "acme", "model": "llama-3.1-8b",
                                     "cluster": {"custom_accelerators": [CUSTOM], "racks": [{"type": "hgx-h100"}]},
                                     "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128}]}))
    assert main(["calibrate", str(probed), "--out", str(tmp_path / "acme"), "--accelerators", str(parts)]) == 0
    hardware = yaml.safe_load((tmp_path / "acme" / "hardware.yaml").read_text())
    assert hardware["accelerators"][0]["id"] == "acme-x1-probed" and hardware["accelerators"][0]["hbm_bandwidth_tb_per_s"] == 3.2
    assert hardware["racks"][0]["id"] == "acme-x1-probed-x1"  # no rack of the part known: one box of the probed devices
    problem = tmp_path / "plan.yaml"
    problem.write_text(yaml.safe_dump({"name": "acme-plan", "model": "llama-3.1-8b",
                                       "cluster": {"kernel_catalog": "acme", "racks": [{"type": "acme-x1-probed-x1"}]},
                                       "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128}]}))
    run = _estimate(tmp_path, "acme", str(problem))
    assert run["accelerator"] == "acme-x1-probed" and run["kernel_source"].startswith("planner probe")


def test_the_budget_trims_shapes_never_below_eight():
    from planner.probe.run import _timed

    shapes = [{"m": i} for i in range(20)]
    spent = _timed(shapes, 0.0, lambda s: 1e-6, lambda text: None, "gemm")  # a budget already spent: the first 8 still run
    assert [s["m"] for s, _ in spent] == list(range(8))
    assert len(_timed(shapes, 60.0, lambda s: 1e-6, lambda text: None, "gemm")) == 20
    failing = _timed(shapes, 0.0, lambda s: None if s["m"] % 2 else 1e-6, lambda text: None, "gemm")  # skipped shapes do not count
    assert [s["m"] for s, _ in failing] == [0, 2, 4, 6, 8, 10, 12, 14]


def test_the_time_left_goes_to_the_classes_still_waiting():
    from planner.probe.run import Budget

    budget = Budget(12.0, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert budget["a"] == pytest.approx(2.0, rel=1e-3)  # 12 s x 1 / 6
    assert budget["c"] == pytest.approx(7.2, rel=1e-3)  # a spent nothing: 12 s x 3 / 5
    assert budget["b"] == pytest.approx(12.0, rel=1e-3)  # all that is left


def test_a_timed_graph_holds_enough_operand_copies_to_span_the_flush():
    from planner.probe.timing import MAX_COPIES, operand_copies

    mib = 2**20
    assert operand_copies(100 * mib, 256 * mib) == 3  # 300 MiB of operands >= 256 MiB
    assert operand_copies(1 * mib, 256 * mib) == 256  # 256 x 1 MiB
    assert operand_copies(2**30, 256 * mib) == 1  # one copy already dwarfs the flush
    assert operand_copies(1024, 256 * mib) == MAX_COPIES == 256  # a tiny shape: the cap
    assert operand_copies(0, 256 * mib) == MAX_COPIES  # operands that allocated nothing new


# `nvidia-smi -q -d PERFORMANCE` on the H100 lent to the session of 2026-11-26 (driver 580.159.04), as it printed it
SMI_PERFORMANCE = """\
    Clocks Event Reasons
        Idle                                           : Not Active
        Applications Clocks Setting                    : Not Active
        SW Power Cap                                   : Not Active
        HW Slowdown                                    : Not Active
            HW Thermal Slowdown                        : Not Active
            HW Power Brake Slowdown                    : Not Active
        Sync Boost                                     : Not Active
        SW Thermal Slowdown                            : Not Active
        Display Clock Setting                          : Not Active
    Clocks Event Reasons Counters
        SW Power Capping                               : 17429198 us
        Sync Boost                                     : 0 us
        SW Thermal Slowdown                            : 0 us
        HW Thermal Slowdown                            : 0 us
        HW Power Braking                               : 0 us
    Sparse Operation Mode                              : Disabled
    GPU Power Readings
        Average Power Draw                             : 136.87 W
"""


def test_the_throttling_counters_are_read_and_differenced():
    from planner.probe.provenance import parse_throttle_counters, throttled_us

    counters = parse_throttle_counters(SMI_PERFORMANCE)
    # the five counters of the section, not the "Clocks Event Reasons" flags above it nor "Sparse Operation Mode" after it
    assert counters == {"SW Power Capping": 17429198.0, "Sync Boost": 0.0, "SW Thermal Slowdown": 0.0, "HW Thermal Slowdown": 0.0,
                        "HW Power Braking": 0.0}
    later = counters | {"SW Power Capping": 17429198.0 + 2.5e6, "HW Thermal Slowdown": 40.0}
    assert throttled_us(counters, later) == {"SW Power Capping": 2.5e6, "HW Thermal Slowdown": 40.0}  # only what grew
    assert parse_throttle_counters("Timestamp : Thu Nov 26\n    Clocks\n        SM : 1980 MHz\n") == {}  # no such section



def test_an_unwritable_out_stops_the_probe_before_it_measures(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a directory")
    assert main(["probe", "llama-3.1-8b", "--smoke", "--out", str(taken)]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "--out" in err and "cannot be written" in err and "probing" not in captured.out  # nothing was measured
