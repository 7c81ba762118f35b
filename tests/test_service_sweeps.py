"""Sweeps as jobs over HTTP (planner/service/sweep_jobs.py): a sweep submitted, polled to done and its
table read equal `planner sweep`'s CSV and summary for the same spec (the CLI run here, in-process);
cancel; the server's limits (points per sweep, sweeps at once -> 503); bad input answers 4xx with
the messages `planner sweep` gives for the same file."""

import csv
import io
import time

import pytest
import yaml

pytest.importorskip("fastapi", reason="the service's extra (fastapi) is not installed: pip install '.[serve]'")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx: pip install '.[test]'")
from fastapi.testclient import TestClient

from planner.cli.main import main
from planner.errors import PlannerInputError
from planner.paths import data_dir
from planner.service.app import ServiceSettings, create_app
from planner.service.sweep_jobs import SweepLimits
from planner.studies.sweep import load_sweep
from planner.studies.sweep_run import RUN_DEPENDENT

BASE = "llama-3.1-70b-hgx-h100"
SPEC = {"name": "t", "base": BASE, "racks": ["hgx-h100", "hgx-b200"],
        "axes": [{"field": "workloads[0].tpot_limit_ms", "values": [30, 60]}], "time_limit_s": 5}  # 4 points, ~0.4 s each
EIGHT = SPEC | {"axes": [{"field": "workloads[0].tpot_limit_ms", "values": [30, 40, 50, 60]}]}


def _wait(client, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = client.get(f"/v1/sweeps/{job_id}").json()
        if record["status"] in ("done", "failed", "cancelled"):
            return record
        time.sleep(0.05)
    raise AssertionError(f"sweep {job_id} still {record['status']} after {timeout_s} s")


def _idle(app, timeout_s: float = 60.0) -> None:
    """Until no sweep thread is left (a cancelled one ends with its current point)."""
    deadline = time.monotonic() + timeout_s
    while app.state.sweeps.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.sweeps.running() == 0


def _without_run_dependent(text: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text, newline="")))
    keep = [i for i, c in enumerate(rows[0]) if c not in RUN_DEPENDENT]
    return [[row[i] for i in keep] for row in rows]


@pytest.fixture(scope="module")
def cli_sweep(tmp_path_factory):
    """`planner sweep` on SPEC: its CSV text and its summary lines."""
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "t.yaml").write_text(yaml.safe_dump(SPEC))
    assert main(["sweep", str(tmp / "t.yaml"), "--out", str(tmp / "out")]) == 0
    summary = [line.removeprefix("- ") for line in (tmp / "out" / "summary.md").read_text().splitlines()[2:]]
    return (tmp / "out" / "t.csv").read_text(), summary


def test_a_submitted_sweep_runs_to_the_cli_table_and_summary(cli_sweep):
    csv_text, summary = cli_sweep
    document = yaml.safe_load((data_dir("problems") / f"{BASE}.yaml").read_text())
    app = create_app()
    with TestClient(app) as client:
        for spec in (SPEC, SPEC | {"base": document}):  # the base by name, and written inline
            answer = client.post("/v1/sweeps", json=spec)
            assert answer.status_code == 202 and answer.json()["points"] == 4 and answer.json()["status"] in ("queued", "running")
            assert answer.headers["location"] == answer.json()["progress"] == f"/v1/sweeps/{answer.json()['id']}"
            record = _wait(client, answer.json()["id"])
            assert record["status"] == "done" and record["points_done"] == 4 and record["summary"] == summary and record["elapsed_s"] > 0
            table = client.get(f"{record['table']}?format=csv")
            assert table.headers["content-type"].startswith("text/csv")
            assert table.text.splitlines()[0] == csv_text.splitlines()[0]  # every column, in the CLI's order
            assert _without_run_dependent(table.text) == _without_run_dependent(csv_text)
            rows = client.get(record["table"]).json()
            cli_rows = list(csv.DictReader(io.StringIO(csv_text, newline="")))
            assert [r["id"] for r in rows["rows"]] == [r["id"] for r in cli_rows] == ["p0000", "p0001", "p0002", "p0003"]
            assert [r["usd_per_million_output_tokens"] for r in rows["rows"]] == [float(r["usd_per_million_output_tokens"]) for r in cli_rows]
            assert rows["columns"] == csv_text.splitlines()[0].split(",")


def test_a_sweep_is_cancelled_and_keeps_its_finished_points():
    app = create_app()
    with TestClient(app) as client:
        job = client.post("/v1/sweeps", json=EIGHT).json()
        cancelled = client.delete(f"/v1/sweeps/{job['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        _idle(app)
        record = client.get(f"/v1/sweeps/{job['id']}").json()
        assert record["status"] == "cancelled" and record["points_done"] < 8
        table = client.get(f"/v1/sweeps/{job['id']}/table").json()
        assert len(table["rows"]) == record["points_done"] and table["status"] == "cancelled"
        assert client.delete(f"/v1/sweeps/{job['id']}").status_code == 200  # a finished sweep is forgotten
        assert client.get(f"/v1/sweeps/{job['id']}").status_code == 404


def test_the_server_limits_points_per_sweep_and_sweeps_at_once():
    app = create_app(ServiceSettings(sweeps=SweepLimits(max_points=4, max_running=1), retry_after_s=7))
    with TestClient(app) as client:
        over = client.post("/v1/sweeps", json=SPEC | {"models": ["llama-3.1-70b", "qwen3-32b"]})  # 2 x 4 points
        assert over.status_code == 400 and over.json()["issues"][0]["field"] == "axes"
        assert "8 problems, over the 4 this server solves in one sweep" in over.json()["error"]
        huge = client.post("/v1/sweeps", json=SPEC | {"racks": None, "axes": [{"field": f"solver.seed{k}", "values": list(range(256))} for k in range(8)]})
        assert huge.status_code == 400 and "18,446,744,073,709,551,616 problems" in huge.json()["error"]  # 256**8: counted, never listed
        first = client.post("/v1/sweeps", json=SPEC)
        assert first.status_code == 202
        busy = client.post("/v1/sweeps", json=SPEC)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "7" and "1 sweep(s) running" in busy.json()["error"]
        client.delete(f"/v1/sweeps/{first.json()['id']}")
        _idle(app)
        again = client.post("/v1/sweeps", json=SPEC | {"time_limit_s": 1000, "racks": ["hgx-h100"], "axes": []})
        assert again.status_code == 202 and _wait(client, again.json()["id"])["status"] == "done"


def test_bad_sweeps_answer_the_cli_messages(tmp_path):
    bad = SPEC | {"mode": "diagonal", "colour": 3, "time_limit_s": -1}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(PlannerInputError) as cli:
        load_sweep(tmp_path / "bad.yaml")
    expected = [{"field": i.field, "problem": i.problem, "fix": i.fix} for i in cli.value.issues]
    with TestClient(create_app()) as client:
        answer = client.post("/v1/sweeps", json=bad)
        assert answer.status_code == 400 and answer.json()["issues"] == expected and len(expected) == 3
        missing = client.post("/v1/sweeps", json=SPEC | {"axes": [{"field": "workloads[5].input_tokens", "values": [1]}]})
        assert missing.status_code == 400 and missing.json()["issues"][0]["field"] == "axes[workloads[5].input_tokens]"
        unknown = client.post("/v1/sweeps", json=SPEC | {"base": "../../etc/passwd"})
        assert unknown.status_code == 400 and unknown.json()["issues"][0]["field"] == "base"
        for spec in (SPEC | {"base": {"model": {"config_json": "/etc/passwd"}}},
                     SPEC | {"axes": [{"field": "model", "values": [{"config_json": "/etc/passwd"}]}]}):
            refused = client.post("/v1/sweeps", json=spec)
            assert refused.status_code == 400 and "names a file on the server" in refused.json()["error"], refused.text
        assert client.post("/v1/sweeps", content=b"[1, 2]").status_code == 400
        for method, path in (("GET", "/v1/sweeps/nope"), ("GET", "/v1/sweeps/nope/table"), ("DELETE", "/v1/sweeps/nope")):
            assert client.request(method, path).status_code == 404


def test_a_running_sweeps_table_is_not_ready_and_a_table_format_is_checked():
    app = create_app()
    with TestClient(app) as client:
        job = client.post("/v1/sweeps", json=EIGHT).json()
        early = client.get(f"/v1/sweeps/{job['id']}/table")
        assert early.status_code == 409 and "poll /v1/sweeps/" in early.json()["error"] + early.text
        _wait(client, job["id"])
        assert client.get(f"/v1/sweeps/{job['id']}/table?format=xlsx").status_code == 400


def test_the_openapi_document_describes_a_sweep_body_with_its_base_inline_or_bundled():
    with TestClient(create_app()) as client:
        document = client.get("/openapi.json").json()
    body = document["paths"]["/v1/sweeps"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    base = body["properties"]["base"]["anyOf"]
    assert BASE in base[0]["enum"] and base[1] == {"$ref": "#/components/schemas/Problem"}
    assert body["properties"]["axes"]["items"] == {"$ref": "#/components/schemas/Axis"} and "Axis" in document["components"]["schemas"]
    assert {"/v1/sweeps/{job_id}", "/v1/sweeps/{job_id}/table"} <= set(document["paths"])


def test_a_stopping_server_cancels_its_sweeps():
    app = create_app()
    with TestClient(app) as client:
        job = client.post("/v1/sweeps", json=EIGHT).json()
    assert app.state.sweeps.running() == 0  # the shutdown waited for the job's current point
    record = app.state.sweeps.get(job["id"]).record()
    assert record["status"] == "cancelled" and record["points_done"] < 8
