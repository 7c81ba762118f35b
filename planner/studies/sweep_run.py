"""Running a sweep's points: in local worker processes (default) or on a Ray cluster, resumable.

Every finished point is appended at once to `rows.jsonl` in the output directory, so an interrupted
sweep resumes from what is written. The rows of a point depend only on the point and the sweep's
seed and time limit (one CP-SAT worker per point), not on which executor ran it; the columns that
do depend on it (`solve_s`) are named in `RUN_DEPENDENT`.
"""

import json
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path

from planner.studies.sweep import SweepPoint

__all__ = ["RUN_DEPENDENT", "read_rows", "run_sweep", "solve_point"]

RUN_DEPENDENT = ("solve_s",)
ROWS_FILE = "rows.jsonl"


def solve_point(point: SweepPoint, base_dir: str, time_limit_s: float, seed: int) -> list[dict]:
    """The point's rows, one per workload (a single row with the reason when it has no plan).
    Runs in a worker: every failure becomes a row, never an exception."""
    from planner.errors import PlannerInputError
    from planner.problem.resolve import resolve_problem
    from planner.problem.schema import parse_problem
    from planner.solver.infeasibility import explain_infeasibility
    from planner.solver.solve import solve
    from planner.studies.sweeps import infeasibility_note, workload_rows

    head = {"point": point.index, "id": point.id, **point.labels}
    start = time.perf_counter()
    try:
        resolved = resolve_problem(parse_problem(point.problem, source=point.id), base_dir=Path(base_dir), source=point.id)
        result = solve(resolved, time_limit_s=time_limit_s, seed=seed, workers=1, explain=False)
        stats, planned = result.stats, result.has_plan
        why = None if planned else infeasibility_note(explain_infeasibility(result))  # what `planner solve` says, on one line
        return [{**head, "workload": row.workload, "status": row.status, "reason": why if why and row.note == row.status else row.note,
                 **{k: v for k, v in asdict(row).items() if k not in ("workload", "status", "note")},
                 "objective": stats.objective if planned else None, "bound": stats.best_bound if planned else None,
                 "gap": stats.gap if planned else None, "objective_unit": stats.objective_unit, "solve_s": time.perf_counter() - start}
                for row in workload_rows(result)]
    except PlannerInputError as exc:
        return [{**head, "status": "INVALID", "reason": "; ".join(f"{i.field}: {i.problem}" for i in exc.issues),
                 "solve_s": time.perf_counter() - start}]
    except Exception as exc:  # noqa: BLE001 - one point's failure is a row of the table, not the end of the sweep
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return [{**head, "status": "ERROR", "reason": f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})",
                 "solve_s": time.perf_counter() - start}]


def read_rows(out_dir: Path) -> dict[int, list[dict]]:
    """Rows already written, by point index (a partly written last line is ignored)."""
    done: dict[int, list[dict]] = {}
    path = out_dir / ROWS_FILE
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        done[record["point"]] = record["rows"]
    return done


def _append(out_dir: Path, point: SweepPoint, rows: list[dict]) -> None:
    with open(out_dir / ROWS_FILE, "a") as f:
        f.write(json.dumps({"point": point.index, "id": point.id, "rows": rows}) + "\n")
        f.flush()
        os.fsync(f.fileno())


Progress = Callable[[int, int], None]


def _solve_indexed(task: tuple[int, SweepPoint, tuple]) -> tuple[int, list[dict]]:
    k, point, args = task
    return k, solve_point(point, *args)


def _ignore_interrupts() -> None:
    """Workers leave Ctrl-C to the parent, which stops them all at once (a worker interrupted on its
    own would die mid-task and leave the pool waiting for it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _local(points: list[SweepPoint], args: tuple, workers: int) -> Iterable[tuple[SweepPoint, list[dict]]]:
    if workers <= 1:
        for p in points:
            yield p, solve_point(p, *args)
        return
    # spawn, not fork: the parent runs a progress-bar thread, and a forked child could inherit a held lock
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_ignore_interrupts)
    try:
        for k, rows in pool.imap_unordered(_solve_indexed, [(k, p, args) for k, p in enumerate(points)]):
            yield points[k], rows
        pool.close()
    finally:
        pool.terminate()  # on Ctrl-C (or any error) the points in progress stop now; finished ones are already written
        pool.join()


def _ray(points: list[SweepPoint], args: tuple, address: str) -> Iterable[tuple[SweepPoint, list[dict]]]:
    try:
        import ray
    except ImportError:
        from planner.errors import InputIssue, PlannerInputError

        raise PlannerInputError(InputIssue("--ray", "Ray is not installed", "pip install 'llm-deployment-planner[sweep]' (or ray)")) from None
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(solve_point)
    pending = {remote.remote(p, *args): p for p in points}
    while pending:
        finished, _ = ray.wait(list(pending), num_returns=1)
        for ref in finished:
            yield pending.pop(ref), ray.get(ref)


def run_sweep(points: list[SweepPoint], out_dir: Path, base_dir: Path, time_limit_s: float, seed: int, *,
              workers: int = 1, ray_address: str | None = None, progress: Progress | None = None) -> list[dict]:
    """Solve the points not yet in `out_dir` and return every row, in point order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = read_rows(out_dir)
    todo = [p for p in points if p.index not in done]
    args = (str(base_dir), time_limit_s, seed)
    if progress:
        progress(len(points) - len(todo), len(points))
    runner = _ray(todo, args, ray_address) if ray_address else _local(todo, args, workers)
    try:
        for point, rows in runner:
            _append(out_dir, point, rows)
            done[point.index] = rows
            if progress:
                progress(len(done), len(points))
    finally:
        runner.close()  # interrupted: the local workers stop at once, not when the traceback is freed
    return [row for p in points for row in done.get(p.index, [])]
