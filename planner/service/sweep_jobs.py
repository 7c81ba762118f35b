"""Sweeps as jobs: `POST /v1/sweeps` validates a sweep document as `planner sweep` validates a sweep
file, then solves its points in the background with the same executor (planner/studies/sweep_run.py:
local worker processes, or Ray when the server was started with --sweep-ray) while the client polls.

Bounded like the rest of the server: points per sweep (`max_points`), sweeps running at once
(`max_running`, beyond which a submission is answered 503), each point's CP-SAT time limit, and the
finished jobs kept in memory (`keep`, the oldest forgotten first). A job's rows are written to a
temporary directory the server creates (the executor appends each finished point there) and read
back into memory when the job ends; the directory is removed then. Nothing a request sends becomes a
path: the base problem is a bundled problem's name (looked up in a fixed list) or a document, and
no point's problem may name a file on the server."""

import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import (
    InputIssue,
    PlannerInputError,
    load_yaml_file,
    unknown_name_issue,
)
from planner.paths import data_dir
from planner.service.inputs import bundled_problems, refuse_paths
from planner.studies.sweep import (
    SweepPoint,
    SweepSpec,
    expand_sweep,
    parse_sweep,
    sweep_size,
)

__all__ = ["SweepJob", "SweepJobs", "SweepLimits", "TooManySweeps", "parse_sweep_request"]

INLINE_BASE = "(inline)"  # the base a sweep document with its problem written inline is validated with


@dataclass(frozen=True)
class SweepLimits:
    max_points: int = 64  # points of one sweep (each a full solve)
    max_running: int = 1  # sweeps queued or running at once; more are answered 503
    keep: int = 16  # finished sweeps kept for their table
    workers: int = 1  # local worker processes of one sweep (1: solved in the job's own thread)
    ray_address: str | None = None  # run the points on Ray instead (only when the server was started so)
    time_limit_s: float = 30.0  # CP-SAT time limit of one point, at most
    shutdown_wait_s: float = 10.0  # how long a stopping server waits for its cancelled sweeps' current points


class TooManySweeps(Exception):
    """As many sweeps as the server runs at once are queued or running."""


class Cancelled(Exception):
    pass


@dataclass
class SweepJob:
    """One sweep: queued, then running, then done, failed or cancelled."""

    id: str
    spec: SweepSpec
    points: list[SweepPoint]
    state: str = "queued"
    done: int = 0
    rows: list[dict] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    error: str | None = None
    submitted_s: float = field(default_factory=time.monotonic)
    finished_s: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    def record(self) -> dict:
        """What `GET /v1/sweeps/{id}` answers: the state, the points done, and when done the summary `planner sweep` prints."""
        answer = {"id": self.id, "name": self.spec.name, "status": self.state, "points_done": self.done, "points": len(self.points),
                  "progress": f"/v1/sweeps/{self.id}", "table": f"/v1/sweeps/{self.id}/table",
                  "elapsed_s": (self.finished_s or time.monotonic()) - self.submitted_s}
        if self.state == "done":
            answer["summary"] = self.summary
        if self.error is not None:
            answer["error"] = self.error
        return answer


def _base_document(spec_base: str | dict) -> tuple[dict, Path]:
    """The base problem's document and the directory its relative names resolve from."""
    if isinstance(spec_base, dict):
        refuse_paths(spec_base, "base")
        return spec_base, data_dir("problems")
    bundled = bundled_problems()
    name = spec_base.removesuffix(".yaml")
    if name not in bundled:  # a membership test: the text never becomes a path
        raise PlannerInputError(unknown_name_issue("base", "bundled problem", name[:80], bundled))
    document = load_yaml_file(bundled[name])
    return document, bundled[name].parent


def parse_sweep_request(body: object, max_points: int) -> tuple[SweepSpec, list[SweepPoint], Path]:
    """A sweep document from a request (its base a bundled problem's name or a problem document),
    validated with `planner sweep`'s schema and messages, and expanded into its points."""
    if not isinstance(body, dict):
        raise PlannerInputError(InputIssue("(body)", "the request body is not a JSON object",
                                           "send a sweep document (planner schema --sweep), its base a bundled problem's name or a problem"))
    base = body.get("base")
    spec = parse_sweep({**body, "base": INLINE_BASE} if isinstance(base, dict) else body, "sweep")
    size = sweep_size(spec)
    if size > max_points:
        raise PlannerInputError(InputIssue("axes", f"{size:,} problems, over the {max_points:,} this server solves in one sweep",
                                           "split the sweep into smaller ones, or run it with planner sweep"))
    document, base_dir = _base_document(base if isinstance(base, dict) else spec.base)
    points = expand_sweep(spec, document)
    for point in points:  # an axis may set a field that names a file (model.config_json): refused as in the base
        refuse_paths(point.problem, f"{point.id} (axes)")
    return spec, points, base_dir


class SweepJobs:
    """The server's sweep jobs by id: each runs on its own thread, at most `max_running` at once."""

    def __init__(self, limits: SweepLimits):
        self.limits = limits
        self._jobs: OrderedDict[str, SweepJob] = OrderedDict()
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def running(self) -> int:
        """Jobs whose thread has not ended (a cancelled job holds its place until its current point ends)."""
        with self._lock:
            return sum(t.is_alive() for t in self._threads.values())

    def get(self, job_id: str) -> SweepJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def submit(self, spec: SweepSpec, points: list[SweepPoint], base_dir: Path) -> SweepJob:
        with self._lock:
            self._threads = {k: t for k, t in self._threads.items() if t.is_alive()}
            if len(self._threads) >= self.limits.max_running:
                raise TooManySweeps()
            job = SweepJob(secrets.token_hex(8), spec, points)
            self._jobs[job.id] = job
            self._forget_oldest()
            thread = threading.Thread(target=self._run, args=(job, base_dir), name=f"planner-sweep-{job.id}", daemon=True)
            self._threads[job.id] = thread
        thread.start()
        return job

    def _forget_oldest(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.finished]
        for k in finished[:max(0, len(finished) - self.limits.keep)]:
            del self._jobs[k]

    def cancel(self, job_id: str) -> SweepJob | None:
        """Cancel a queued or running job (its finished points stay in its table); forget a finished one."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            if job.finished:
                del self._jobs[job_id]
                return job
            job.cancel.set()
            job.state = "cancelled"
            return job

    def close(self, timeout_s: float) -> None:
        """At the server's shutdown: cancel every unfinished job and wait up to `timeout_s` for their
        threads (each ends with its current point), so that their temporary directories are removed."""
        with self._lock:
            unfinished = [j for j in self._jobs.values() if not j.finished]
            threads = list(self._threads.values())
        for job in unfinished:
            self.cancel(job.id)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _progress(self, job: SweepJob, done: int, total: int) -> None:
        if job.cancel.is_set():
            raise Cancelled()
        job.done = done
        if job.state == "queued":
            job.state = "running"

    def _run(self, job: SweepJob, base_dir: Path) -> None:
        from planner.output.sweep_table import summary_lines
        from planner.studies.sweep_run import read_rows, run_sweep

        out = Path(tempfile.mkdtemp(prefix="planner-sweep-"))
        time_limit_s = min(job.spec.time_limit_s, self.limits.time_limit_s)
        try:
            job.rows = run_sweep(job.points, out, base_dir, time_limit_s, job.spec.seed, workers=self.limits.workers,
                                 ray_address=self.limits.ray_address, progress=lambda d, t: self._progress(job, d, t))
            job.summary = summary_lines(job.rows, [a.column() for a in job.spec.all_axes()])
            job.state = "done"
        except Cancelled:
            done = read_rows(out)
            job.rows = [row for p in job.points for row in done.get(p.index, [])]
            job.done = len(done)
        except PlannerInputError as exc:
            job.state, job.error = "failed", exc.render()
        except Exception as exc:  # noqa: BLE001 - the job fails and says why; the server goes on
            job.state, job.error = "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            job.finished_s = time.monotonic()
            shutil.rmtree(out, ignore_errors=True)
