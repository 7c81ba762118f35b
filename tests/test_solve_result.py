"""The solve result is a frozen, typed record, and the fleet placement takes typed arguments."""

import dataclasses
import typing

import pytest

from planner.hardware.catalog import load_hardware_catalog
from planner.physics.deployment import Layout
from planner.placement.fleet import PlacedDeployment, PlacementFailed, place_plan
from planner.solver.result import Deployment, SolveResult, SolverStats


@pytest.mark.parametrize("record", [SolveResult, Deployment, SolverStats])
def test_solve_records_are_frozen_and_name_their_types(record):
    assert record.__dataclass_params__.frozen
    hints = typing.get_type_hints(record)
    loose = [name for name, hint in hints.items() if hint is object or object in typing.get_args(hint)]
    assert loose == []


def test_a_solved_result_cannot_be_edited_in_place(solved_bundled):
    _, result = solved_bundled["llama-3.1-70b-hgx-h100"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.placement = None
    assert isinstance(result.deployments, tuple) and isinstance(result.notes, tuple)


def test_place_plan_packs_typed_deployments_around_a_broken_accelerator():
    # One HGX H100 box (8 GPUs) with GPU 1 broken, one replica of TP4 (one stage of 4): the aligned
    # blocks of 4 are [0, 4) and [4, 8); the first holds the broken GPU, so the stage takes GPUs 4-7,
    # tensor ranks 0-3 in order. Llama 3.1 70B has 80 layers: the one stage holds 0-79.
    rack = load_hardware_catalog().racks["hgx-h100"]
    placement = place_plan([(rack, 1)], {"hgx-h100": {0: (1,)}}, [PlacedDeployment("hgx-h100", Layout(tp=4), 1, 80)])
    assert [r.accelerator for r in placement.roles] == [f"hgx-h100#0/{i}" for i in range(4, 8)]
    assert [r.tp_rank for r in placement.roles] == [0, 1, 2, 3]
    assert {r.layers for r in placement.roles} == {(0, 80)}
    assert placement.racks == {"hgx-h100#0": (8, (1,))}
    # two such replicas need both blocks, and one of them holds the broken GPU
    with pytest.raises(PlacementFailed):
        place_plan([(rack, 1)], {"hgx-h100": {0: (1,)}}, [PlacedDeployment("hgx-h100", Layout(tp=4), 2, 80)])
