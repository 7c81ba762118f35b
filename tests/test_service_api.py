"""`planner serve`'s JSON endpoints against the command line: for the same input every answer equals
the JSON the CLI writes (the CLI run here, in-process, on the same problem), bad input answers 4xx
with the CLI's message, and the server's limits (token, body size, busy pool, timeout) hold."""

import json
import re
import threading
import time

import pytest
import yaml

pytest.importorskip("fastapi", reason="the service's extra (fastapi) is not installed: pip install '.[serve]'")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx: pip install '.[test]'")
from fastapi.testclient import TestClient

from planner.cli.main import main
from planner.paths import data_dir
from planner.service import actions
from planner.service.app import ServiceSettings, create_app

BUNDLED = "deepseek-v3-gb200-nvl72"
TIMINGS = ("wall_time_s", "total_time_s")  # how long this run took: the only figures two runs may differ in


def _without_timings(record: dict) -> dict:
    return record | {"solver": {k: v for k, v in record["solver"].items() if k not in TIMINGS}}


def _cli_json(tmp_path, argv: list[str], name: str = "out.json") -> tuple[int, dict]:
    out = tmp_path / name
    code = main([*argv, "--json", str(out)])
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(ServiceSettings())) as c:
        yield c


@pytest.fixture(scope="module")
def solved(client, tmp_path_factory):
    """The bundled problem solved once by the CLI (plan file) and once by the service."""
    tmp = tmp_path_factory.mktemp("solve")
    code, cli = _cli_json(tmp, ["solve", BUNDLED], "plan.json")
    answer = client.post("/v1/solve", json={"problem": BUNDLED})
    return code, cli, answer, tmp / "plan.json"


def test_solve_answers_the_cli_plan(solved):
    code, cli, answer, _ = solved
    assert code == 0 and answer.status_code == 200
    assert _without_timings(answer.json()) == _without_timings(cli)
    assert answer.json()["status"] == "OPTIMAL" and answer.json()["deployments"][0]["placement"]


def test_a_problem_document_solves_as_its_file(client, solved):
    document = yaml.safe_load((data_dir("problems") / f"{BUNDLED}.yaml").read_text())
    answer = client.post("/v1/solve", json={"problem": document})
    assert answer.status_code == 200
    assert _without_timings(answer.json()) == _without_timings(solved[1])


def test_export_check_and_view_answer_what_the_cli_writes(client, solved, capsys):
    _, cli, _, plan_path = solved
    capsys.readouterr()
    assert main(["export", str(plan_path), "--format", "vllm"]) == 0
    script = capsys.readouterr().out
    answer = client.post("/v1/export", json={"plan": cli, "format": "vllm"})
    assert answer.status_code == 200 and answer.json()["text"] == script and answer.json()["filename"] == "launch-vllm.sh"
    assert client.post("/v1/check", json={"plan": cli}).json()["valid"] is True
    svg = client.post("/v1/view", json={"plan": cli, "colour_by": "expert"})
    assert svg.headers["content-type"].startswith("image/svg+xml")
    n = sum(len(d["placement"]) for d in cli["deployments"])
    assert len(re.findall(r"<title>[^<]*, expert rank \d+</title>", svg.text)) == n  # one tooltip per placed accelerator


def test_check_of_a_broken_plan_lists_what_the_cli_prints(client, solved, tmp_path, capsys):
    _, cli, _, _ = solved
    broken = json.loads(json.dumps(cli))
    broken["deployments"][0]["batch_per_replica"] *= 64  # far past the TPOT limit and HBM
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    capsys.readouterr()
    assert main(["check", str(path)]) == 1
    printed = capsys.readouterr().err
    answer = client.post("/v1/check", json={"plan": broken}).json()
    assert answer["valid"] is False and answer["violations"]
    for violation in answer["violations"]:
        assert violation.split("\n")[0][:60] in printed
    refused = client.post("/v1/export", json={"plan": broken, "format": "vllm"})
    assert refused.status_code == 400 and "the plan fails its check" in refused.json()["error"]


def test_estimate_answers_the_cli_figures(client, tmp_path):
    flags = {"ep": 16, "batch": 1024, "isl": 3072}
    code, cli = _cli_json(tmp_path, ["estimate", BUNDLED, "--ep", "16", "--batch", "1024", "--isl", "3072"])
    answer = client.post("/v1/estimate", json={"problem": BUNDLED, **flags})
    assert code == 0 and answer.status_code == 200 and answer.json() == cli


def test_compare_frontier_and_curve_answer_the_cli_records(client, tmp_path):
    problem = "llama-3.1-70b-hgx-h100"
    code, cli = _cli_json(tmp_path, ["compare", problem, "--racks", "hgx-h100,hgx-h200"], "c.json")
    answer = client.post("/v1/compare", json={"problem": problem, "racks": ["hgx-h100", "hgx-h200"]}).json()
    assert code == 0 and answer == cli and [r["rack_id"] for r in answer["rows"]] == ["hgx-h100", "hgx-h200"]
    code, cli = _cli_json(tmp_path, ["frontier", problem, "--points", "3"], "f.json")
    assert code == 0 and client.post("/v1/frontier", json={"problem": problem, "points": 3}).json() == cli
    code, cli = _cli_json(tmp_path, ["curve", problem, "--points", "4"], "k.json")
    assert code == 0 and client.post("/v1/curve", json={"problem": problem, "points": 4}).json() == cli


def test_catalog_and_schemas_are_the_cli_documents(client, tmp_path, capsys):
    code, cli = _cli_json(tmp_path, ["catalog"])
    assert code == 0 and client.get("/v1/catalog").json() == cli
    capsys.readouterr()
    assert main(["schema", "--plan"]) == 0
    assert client.get("/v1/schema/plan").json() == json.loads(capsys.readouterr().out)
    assert client.get("/v1/schema/problem").json()["title"] == "Problem"
    assert client.get("/v1/schema/nope").status_code == 400
    names = client.get("/v1/problems").json()
    assert BUNDLED in names and names[BUNDLED]["model"] == yaml.safe_load((data_dir("problems") / f"{BUNDLED}.yaml").read_text())["model"]


def test_an_infeasible_problem_answers_its_conflicts(client, tmp_path):
    problem = "infeasible-llama-3.1-70b-demand"
    code, cli = _cli_json(tmp_path, ["solve", problem])
    answer = client.post("/v1/solve", json={"problem": problem})
    assert code == 3 and answer.status_code == 200
    assert answer.json()["status"] == "INFEASIBLE" and answer.json()["infeasibility"] == cli["infeasibility"]
    assert answer.json()["infeasibility"]["conflicts"]


def test_a_bad_option_answers_the_cli_message(client, capsys):
    with pytest.raises(SystemExit):
        main(["solve", BUNDLED, "--time-limit", "-1"])
    cli_message = capsys.readouterr().err.strip().splitlines()[-1].split("error: ", 1)[1]
    answer = client.post("/v1/solve", json={"problem": BUNDLED, "time_limit": -1})
    assert answer.status_code == 400 and cli_message in answer.json()["error"]
    assert answer.json()["issues"][0]["field"] == "time_limit"
    unknown = client.post("/v1/solve", json={"problem": BUNDLED, "json": "/tmp/x"})  # a flag that writes a file is no option here
    assert unknown.status_code == 400 and unknown.json()["issues"][0]["field"] == "json"


def test_a_bad_field_answers_the_cli_issue(client, tmp_path, capsys):
    document = yaml.safe_load((data_dir("problems") / f"{BUNDLED}.yaml").read_text())
    document["workloads"][0]["input_tokens"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    capsys.readouterr()
    assert main(["solve", str(path)]) == 2
    cli_issue = capsys.readouterr().err.split(":\n", 1)[1].strip()
    answer = client.post("/v1/solve", json={"problem": document})
    assert answer.status_code == 400 and answer.json()["error"].split(":\n", 1)[1].strip() == cli_issue
    assert answer.json()["issues"][0]["field"] == "workloads[0].input_tokens"


def test_a_problem_cannot_name_a_server_file(client):
    document = {"models": {"m": {"config_json": "/etc/passwd"}}, "cluster": {"racks": [{"type": "hgx-h100"}]},
                "workloads": [{"name": "w", "input_tokens": 8, "output_tokens": 8}]}
    answer = client.post("/v1/solve", json={"problem": document})
    assert answer.status_code == 400 and answer.json()["issues"][0]["field"] == "problem.models.m.config_json"
    for name in ("../../etc/passwd", "/etc/passwd", "deepseek-v3-gb200-nvl72.yaml", "$(id)"):
        assert client.post("/v1/solve", json={"problem": name}).status_code == 400
    assert client.get("/static/..%2F__init__.py").status_code == 404


def test_token_body_limit_busy_pool_and_timeout(monkeypatch):
    release = threading.Event()
    monkeypatch.setitem(actions.ACTIONS, "check", lambda body, limits: release.wait(10) and {"waited": True})
    settings = ServiceSettings(token="s3cret", max_body_bytes=4096, workers=1, backlog=0, request_timeout_s=0.3)
    with TestClient(create_app(settings)) as c:
        assert c.get("/v1/catalog").status_code == 401
        assert c.get("/v1/catalog", headers={"Authorization": "Bearer wrong"}).status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert c.get("/v1/catalog", headers=auth).status_code == 200
        assert c.get("/").status_code == 200  # the page itself carries no data
        assert c.post("/v1/solve", content=b"{" + b" " * 8000 + b"}", headers=auth).status_code == 413
        slow = c.post("/v1/check", json={"plan": 1}, headers=auth)  # holds the only worker past the timeout
        assert slow.status_code == 504 and "no answer within" in slow.json()["error"]
        busy = c.post("/v1/check", json={"plan": 2}, headers=auth)
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "5"
        release.set()
        deadline = time.monotonic() + 30  # the held worker finishes once released; a loaded machine may take a while
        while c.app.state.pool.admitted and time.monotonic() < deadline:
            time.sleep(0.05)  # (release.wait would return at once: it is set)
        assert c.post("/v1/check", json={"plan": 3}, headers=auth).json() == {"waited": True}


def test_view_plot_draws_every_accelerator_of_the_plan(solved, tmp_path):
    _, cli, _, plan_path = solved
    svg, png = tmp_path / "plan.svg", tmp_path / "plan.png"
    assert main(["view", str(plan_path), "--plot", str(svg), "--colour-by", "stage"]) == 0
    assert main(["view", str(plan_path), "--plot", str(png)]) == 0
    text = svg.read_text()
    placed = sum(d["replicas"] * d["accelerators_per_replica"] for d in cli["deployments"])
    in_racks = sum(r["accelerators"] for r in cli["racks"].values())
    assert text.count("<rect ") == 1 + in_racks  # the background, then one cell per accelerator of every rack in use
    assert len(re.findall(r"<title>[^<]*, stage \d+ \(layers", text)) == placed and text.count(": idle</title>") == in_racks - placed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["view", str(plan_path), "--plot", str(tmp_path / "plan.gif")]) == 2
    other = tmp_path / "other.svg"
    assert main(["view", str(plan_path), "--rack", "hgx-h100", "--plot", str(other)]) == 0
    assert "<title>" not in other.read_text()  # --rack draws only that rack type, and the plan has none


def test_work_past_its_deadline_stops_at_the_next_step():
    import time

    past = actions.Limits(deadline=time.monotonic() - 1)
    for name, body in (("frontier", {"problem": "llama-3.1-70b-hgx-h100", "points": 200}), ("compare", {"problem": "llama-3.1-70b-hgx-h100"}),
                       ("solve", {"problem": BUNDLED, "seed": 7})):
        started = time.monotonic()
        with pytest.raises(actions.OutOfTime):
            actions.action_answer(name, body, past)
        assert time.monotonic() - started < 5, name  # 200 frontier points or 18 rack types would take minutes


def test_concurrent_solves_on_the_pool_agree_with_one_at_a_time(solved):
    """The worker threads share the library's caches: plans solved side by side equal the CLI's."""
    cli = solved[1]
    answers = []
    with TestClient(create_app(ServiceSettings(workers=2, backlog=8))) as c:
        def ask(seed: int):
            answers.append(c.post("/v1/solve", json={"problem": BUNDLED, "seed": seed}))

        threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [a.status_code for a in answers] == [200] * 4
    for a in answers:
        assert a.json()["solver"]["objective"] == cli["solver"]["objective"]
        assert [(d["tp"], d["ep"], d["batch_per_replica"]) for d in a.json()["deployments"]] == \
            [(d["tp"], d["ep"], d["batch_per_replica"]) for d in cli["deployments"]]


def test_the_openapi_document_carries_the_problem_and_plan_schemas_and_the_cli_options(client):
    from planner.output.plan import plan_json_schema
    from planner.problem.schema import problem_json_schema

    document = client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    assert set(components["Problem"]["properties"]) == set(problem_json_schema()["properties"])
    assert set(components["Plan"]["properties"]) == set(plan_json_schema()["properties"])
    referred = set(re.findall(r"#/components/schemas/([\w-]+)", json.dumps(document)))
    assert referred <= set(components)
    body = lambda path: document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body("/v1/solve")["properties"]) == {"problem", "time_limit", "seed", "workers", "confidence"}
    assert body("/v1/solve")["properties"]["confidence"]["enum"] == ["median", "high"]
    assert body("/v1/export")["properties"]["plan"] == {"$ref": "#/components/schemas/Plan"}
    assert "--tp" in body("/v1/estimate")["properties"]["tp"]["description"]


def test_planner_serve_listens_on_127_0_0_1_and_serves_the_page(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    from planner.cli.parser import build_parser

    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root), "PLANNER_SERVE_TOKEN": "t0ken"}
    proc = subprocess.Popen([sys.executable, "-m", "planner", "serve", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, health = f"http://127.0.0.1:{port}", None
        for _ in range(200):
            try:
                health = httpx.get(url + "/v1/health", headers={"Authorization": "Bearer t0ken"}, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 200 and health.json()["capacity"] == 2 + 4
        assert httpx.get(url + "/v1/health", timeout=2).status_code == 401  # the token from the environment
        page = httpx.get(url + "/", timeout=2)
        assert page.status_code == 200 and '<script src="/static/app.js">' in page.text
        assert "https://" not in page.text and "https://" not in httpx.get(url + "/static/app.js", timeout=2).text  # nothing from outside
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_pasted_config_json_plans_as_the_catalog_model(client):
    # Llama 3.1 8B's published config.json (its relevant fields); the catalog's llama-3.1-8b was written separately
    config = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "attention_bias": False, "max_position_embeddings": 131072,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    model = client.post("/v1/model", json={"config": config, "id": "my-llama"})
    assert model.status_code == 200 and set(model.json()) == {"inline"}
    document = {"name": "pasted", "model": "llama-3.1-8b", "cluster": {"racks": [{"type": "hgx-h100", "count": 1}]},
                "workloads": [{"name": "chat", "input_tokens": 2048, "output_tokens": 256, "tpot_limit_ms": 30}]}
    catalog = client.post("/v1/solve", json={"problem": document}).json()
    pasted = client.post("/v1/solve", json={"problem": document | {"model": model.json()}}).json()
    assert pasted["status"] == catalog["status"] == "OPTIMAL"
    assert pasted["solver"]["objective"] == catalog["solver"]["objective"]
    refused = client.post("/v1/model", json={"config": {"model_type": "llama"}})
    assert refused.status_code == 400 and refused.json()["issues"][0]["field"] == "config: num_hidden_layers"
