"""Hand-edited plans that `check` and `export` must refuse (issue 22, point 8): each case edits the
plan `planner solve --json` wrote for a bundled problem, and both commands answer with exit code 2,
one issue naming the edited field and a fix, no traceback and no file written."""

import copy
import json

import pytest

from planner.cli.main import main

PROBLEM = "deepseek-v3-wide-ep-skewed"  # MoE with expert parallelism: a placement with expert ranks and an expert map


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("solved") / "plan.json"
    assert main(["solve", PROBLEM, "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    d = record["deployments"][0]
    assert d["ep"] == 8 and d["expert_map"]["n_ranks"] == 8 and d["expert_map"]["slots_per_rank"] == 33  # what the cases assume
    return record


def _deployment(r: dict) -> dict:
    return r["deployments"][0]


def _drop_rack_key_index(r: dict) -> None:
    name = next(iter(r["racks"]))
    r["racks"][name.split("#")[0]] = r["racks"].pop(name)


CASES = {  # name: (edit, field the refusal names)
    "negative prompt length": (lambda r: _deployment(r).update(input_tokens=-4096), "deployments[0].input_tokens"),
    "10^9-token prompt": (lambda r: _deployment(r).update(input_tokens=10**9), "deployments[0].input_tokens"),
    "zero output length": (lambda r: _deployment(r).update(output_tokens=0), "deployments[0].output_tokens"),
    "prompt length not the workload's": (lambda r: _deployment(r).update(input_tokens=4096), "deployments[0].input_tokens"),
    "ragged expert map (a slot deleted)": (lambda r: _deployment(r)["expert_map"]["physical_to_logical_map"][5].pop(),
                                           "deployments[0].expert_map.physical_to_logical_map[5]"),
    "expert id beyond the model's 256": (lambda r: _deployment(r)["expert_map"]["physical_to_logical_map"][7].__setitem__(0, 256),
                                         "deployments[0].expert_map.physical_to_logical_map[7]"),
    "placement entry without its expert rank": (lambda r: _deployment(r)["placement"][3].pop("ep_rank"),
                                                "deployments[0].placement[3].ep_rank"),
    "expert rank null under EP8": (lambda r: _deployment(r)["placement"][3].update(ep_rank=None), "deployments[0].placement[3].ep_rank"),
    "expert rank 8 under EP8": (lambda r: _deployment(r)["placement"][3].update(ep_rank=8), "deployments[0].placement[3].ep_rank"),
    "placement rack instance without its index": (lambda r: _deployment(r)["placement"][0].update(rack="gb200-nvl72"),
                                                  "deployments[0].placement[0].rack"),
    "fleet rack instance without its index": (_drop_rack_key_index, "racks.gb200-nvl72"),
    "accelerator without its index": (lambda r: _deployment(r)["placement"][0].update(accelerator="gb200-nvl72#0"),
                                      "deployments[0].placement[0].accelerator"),
    "accelerator outside its rack": (lambda r: _deployment(r)["placement"][0].update(accelerator="gb200-nvl72#1/0"),
                                     "deployments[0].placement[0].accelerator"),
    "empty layer range": (lambda r: _deployment(r)["placement"][0].update(layers=[5, 5]), "deployments[0].placement[0].layers"),
    "unavailable index beyond the rack": (lambda r: next(iter(r["racks"].values())).update(unavailable=[72]), "unavailable"),
    "precisions deleted": (lambda r: _deployment(r).pop("precisions"), "deployments[0].precisions"),
    "one precision deleted": (lambda r: _deployment(r)["precisions"].pop("kv_cache"), "deployments[0].precisions.kv_cache"),
}


def test_the_unedited_plan_is_valid(plan, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert main(["check", str(path)]) == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hand_edited_plan_is_refused_before_anything_is_written(plan, tmp_path, capsys, case):
    edit, field = CASES[case]
    record = copy.deepcopy(plan)
    edit(record)
    path, out = tmp_path / "plan.json", tmp_path / "launch.sh"
    path.write_text(json.dumps(record))
    capsys.readouterr()
    for argv in (["check", str(path)], ["export", str(path), "-o", str(out)], ["export", str(path), "--format", "json", "-o", str(out)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and "fix:" in err
        assert err.count("\n  - ") == 1, err  # one issue: the edited field, not its consequences
        assert f"{field}:" in err.replace("\n", ""), err  # the console folds a long path
        assert not out.exists()
