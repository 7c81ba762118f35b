"""`planner serve` under load: prints figures, asserts nothing (machines are noisy).

Starts `planner serve` on 127.0.0.1 (a free port, a subprocess) and runs, each phase bounded in
requests and seconds:

- repeat:   N concurrent clients (default 16) asking for the bundled DeepSeek-V3 plan again and again
            (after the first, answered from the server's cache of identical requests);
- distinct: N clients, every request a new question (the same problem with another CP-SAT seed), so
            every one is solved;
- burst:    more simultaneous new questions than the pool holds (workers + backlog + 16): the extra are
            answered 503 with Retry-After at once, none waits past the client's timeout;
- hostile:  1,000 hostile requests (benchmarks/serve_hostile.py) from 8 clients: no 5xx, no traceback.
- sweep:    a 12-point sweep submitted as a job (POST /v1/sweeps), a second submitted while it runs
            (answered 503: one sweep at a time by default), the first polled to done, its CSV read.

Per phase: requests, errors (timeouts, refused connections), bad answers (a 5xx other than the pool's
503, or a traceback in the body), p50/p95/max latency, throughput and the answers by status.

    python benchmarks/bench_serve.py [--clients 16] [--requests 160] [--distinct 32] [--seconds 120] [--quick]
"""

import argparse
import collections
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_hostile import hostile_requests, is_bad_answer

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = "deepseek-v3-gb200-nvl72"
CLIENT_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workers: int, backlog: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "planner", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", str(workers), "--backlog", str(backlog)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start: {proc.stderr.read().decode()[-2000:]}")


class Tally:
    def __init__(self):
        self.latencies, self.statuses, self.errors, self.bad, self.retry_after = [], collections.Counter(), collections.Counter(), 0, 0
        self.lock = threading.Lock()

    def add(self, started: float, status: int | None, text: str = "", error: str | None = None, retry_after: bool = False):
        with self.lock:
            self.latencies.append(time.monotonic() - started)
            if error is not None:
                self.errors[error] += 1
            else:
                self.statuses[status] += 1
                self.bad += is_bad_answer(status, text) and status != 503  # a 503 is the pool's answer when full: counted by status
                self.retry_after += retry_after


def _send(client: httpx.Client, tally: Tally, method: str, path: str, body: bytes) -> None:
    started = time.monotonic()
    try:
        answer = client.request(method, path, content=body, headers={"content-type": "application/json"})
        tally.add(started, answer.status_code, answer.text, retry_after=answer.status_code == 503 and "retry-after" in answer.headers)
    except httpx.TimeoutException:
        tally.add(started, None, error="timeout")
    except httpx.HTTPError as exc:
        tally.add(started, None, error=type(exc).__name__)


def run_phase(url: str, clients: int, jobs: list[tuple[str, str, bytes]], seconds: float, barrier: bool = False) -> tuple[Tally, float]:
    """`jobs` shared by `clients` threads, each with its own connection; stops taking jobs after `seconds`."""
    tally, lock, queue = Tally(), threading.Lock(), list(reversed(jobs))
    gate = threading.Barrier(clients) if barrier else None
    deadline = time.monotonic() + seconds

    def client_loop():
        with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
            if gate is not None:
                gate.wait()
            while time.monotonic() < deadline:
                with lock:
                    if not queue:
                        return
                    job = queue.pop()
                _send(client, tally, *job)

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally, time.monotonic() - started


def _solve(seed: int | None = None) -> tuple[str, str, bytes]:
    body = f'{{"problem": "{BUNDLED}"' + (f', "seed": {seed}' if seed is not None else "") + "}"
    return ("POST", "/v1/solve", body.encode())


SWEEP = {"name": "bench", "base": "llama-3.1-70b-hgx-h100", "racks": ["hgx-h100", "hgx-h200", "hgx-b200", "gb200-nvl72"],
         "axes": [{"field": "workloads[0].tpot_limit_ms", "values": [30, 45, 60]}], "time_limit_s": 5}


def sweep_phase(url: str, seconds: float) -> str:
    """A sweep job from submission to its table: wall time, the second submission's answer, the polls' latency."""
    with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        started = time.monotonic()
        job = client.post("/v1/sweeps", json=SWEEP).json()
        second = client.post("/v1/sweeps", json=SWEEP)
        polls, record = [], job
        while record["status"] in ("queued", "running") and time.monotonic() - started < seconds:
            time.sleep(0.1)
            asked = time.monotonic()
            record = client.get(job["progress"]).json()
            polls.append(time.monotonic() - asked)
        wall = time.monotonic() - started
        table = client.get(job["table"], params={"format": "csv"})
        if record["status"] in ("queued", "running"):
            client.delete(job["progress"])
    polls = sorted(polls) or [0.0]
    return (f"sweep: {record['points_done']} of {record['points']} points {record['status']} in {wall:.2f} s "
            f"({record['points_done'] / wall:.1f} points/s); a second sweep meanwhile: {second.status_code} "
            f"(Retry-After {second.headers.get('retry-after')}); {len(polls)} polls, p50 {statistics.median(polls):.3f} s, "
            f"max {polls[-1]:.3f} s; table: {table.status_code}, {len(table.text.splitlines()) - 1} rows")


def _row(name: str, clients: int, tally: Tally, wall_s: float) -> str:
    lat = sorted(tally.latencies) or [0.0]
    p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
    statuses = " ".join(f"{k}:{v}" for k, v in sorted(tally.statuses.items()))
    errors = sum(tally.errors.values())
    return (f"{name:<9} {clients:>7} {len(tally.latencies):>8} {errors:>6} {tally.bad:>5} {statistics.median(lat):>7.3f} {p95:>7.3f} "
            f"{lat[-1]:>7.3f} {len(tally.latencies) / wall_s:>7.1f}  {statuses}" + (f" {dict(tally.errors)}" if errors else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=160, help="requests of the repeat phase")
    parser.add_argument("--distinct", type=int, default=32, help="requests of the distinct phase")
    parser.add_argument("--hostile", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=120.0, help="time limit of each phase")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="4 clients, a few requests of each kind")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.requests, args.distinct, args.hostile, args.seconds = 4, 16, 4, 50, 60.0
    backlog = max(args.clients, 8)  # every steady client (and each of the 8 hostile ones) finds a place; the burst does not
    proc, url = start_server(args.workers, backlog)
    try:
        print(f"planner serve at {url}: {args.workers} workers, {backlog} waiting at most; {os.cpu_count()} CPUs here")
        first, wall = run_phase(url, 1, [_solve()], args.seconds)
        print(f"first solve of {BUNDLED} (nothing cached): {first.latencies[0]:.2f} s, status {dict(first.statuses)}")
        print(f"{'phase':<9} {'clients':>7} {'requests':>8} {'errors':>6} {'bad':>5} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'req/s':>7}  statuses")
        tally, wall = run_phase(url, args.clients, [_solve()] * args.requests, args.seconds)
        print(_row("repeat", args.clients, tally, wall))
        tally, wall = run_phase(url, args.clients, [_solve(1000 + k) for k in range(args.distinct)], args.seconds)
        print(_row("distinct", args.clients, tally, wall))
        burst = args.workers + backlog + 16
        tally, wall = run_phase(url, burst, [_solve(5000 + k) for k in range(burst)], args.seconds, barrier=True)
        print(_row("burst", burst, tally, wall) + f"; 503 with Retry-After: {tally.retry_after}")
        tally, wall = run_phase(url, 8, hostile_requests(args.hostile, seed=0), args.seconds)
        print(_row("hostile", 8, tally, wall))
        print(sweep_phase(url, args.seconds))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
