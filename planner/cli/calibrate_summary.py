"""What `planner calibrate` prints of a fitted catalog: per system and engine, each kernel class's worst
leave-one-out error, and the classes that miss issue 21's targets. Shared by the calibration from
aiconfigurator's tables (`cli/calibrate.py`) and from a probe (`cli/probe_calibrate.py`)."""

__all__ = ["CLASS_COLUMNS", "summary_rows", "target_misses"]

CLASS_COLUMNS = ("gemm", "moe", "moe_routing", "moe_wide_ep", "attention_decode", "attention_prefill", "mla_decode", "mla_prefill", "all_reduce", "all_to_all")
LOO_MEDIAN_TARGET = 0.10  # issue 21: leave-one-out median error <= 10% in every kernel class...
LOO_MEDIAN_TARGET_MOE = 0.15  # ...and <= 15% for the grouped expert GEMMs


def _fits(node: dict) -> list[dict]:
    """Every fit record (a dict with `loo_error` or `spread`) under `node`, however deeply nested."""
    out, todo = [], [node]
    while todo:
        item = todo.pop()
        if "loo_error" in item or "spread" in item:
            out.append(item)
        else:
            todo.extend(v for v in item.values() if isinstance(v, dict))
    return out


def _worst(fits: list[dict]) -> tuple[float, float] | None:
    """The largest leave-one-out median and p90 over a class's fits (all formats, group sizes, routings)."""
    scored = [f["loo_error"] for f in fits if f.get("loo_error")]
    return (max(e[0] for e in scored), max(e[1] for e in scored)) if scored else None


def summary_rows(record: dict) -> list[tuple[str, ...]]:
    """(system, engine, then per kernel class the worst format's leave-one-out median/p90 error) per engine."""
    rows = []
    for accel in record["accelerators"].values():
        engines = dict(accel.get("engines", {}))
        if accel.get("nccl", {}).get("all_reduce"):  # NCCL's all-reduce: what an engine without its own table runs
            engines["nccl"] = {"all_reduce": accel["nccl"]["all_reduce"]}
        for engine, classes in engines.items():
            cells = []
            for name in CLASS_COLUMNS:
                worst = _worst(_fits(classes[name])) if name in classes else None
                cells.append(f"{worst[0]:.1%}/{worst[1]:.0%}" if worst else "-")
            rows.append((accel["system"], engine, *cells))
    return rows


def target_misses(record: dict) -> list[str]:
    """Classes whose leave-one-out median misses the issue's target (10%; MoE 15%), as 'system engine class format'."""
    misses = []
    for accel in record["accelerators"].values():
        for engine, classes in accel.get("engines", {}).items():
            for name in CLASS_COLUMNS:
                limit = LOO_MEDIAN_TARGET_MOE if name.startswith("moe") else LOO_MEDIAN_TARGET
                worst = _worst(_fits(classes[name])) if name in classes else None
                if worst and worst[0] > limit:
                    misses.append(f"{accel['system']} {engine} {name} ({worst[0]:.1%})")
    return misses
