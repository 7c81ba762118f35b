"""Aggregated workloads of several replicas get a router in every launch script (issue 24: "the router or
gateway that spreads requests over its replicas, for aggregated plans too"): SGLang's own router, or the
planner's spread_router.py for vLLM and TensorRT-LLM; Kubernetes manifests spread them with a Service."""

import json

import httpx
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from planner.output.export import SPREAD_ROUTER, build_launch, export_plan
from planner.output.files import spread_router
from planner.output.launch import HostRef
from planner.output.plan import as_plan
from planner.output.plan_report import solve_record


def _text(w) -> str:
    return "".join(f"<{p.host}>" if isinstance(p, HostRef) else str(p) for p in w)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_every_replica_of_an_aggregated_workload_is_behind_one_router(solved_bundled, engine):
    record = json.loads(json.dumps(solve_record(solved_bundled["llama-3.1-70b-hgx-h100"][1])))
    replicas = sum(d["replicas"] for d in record["deployments"])
    assert replicas > 1 and all(d.get("role", "aggregated") == "aggregated" for d in record["deployments"])
    script = build_launch(as_plan(record), engine)
    routers = [s for s in script.servers if s.deployment < 0]
    assert len(routers) == 1, [s.label for s in routers]  # today: none
    words = [_text(w) for w in routers[0].argv]
    served = {f"<{s.host}>:{s.port}" for s in script.servers if s.deployment >= 0 and s.port}
    assert len(served) == replicas  # one HTTP server per replica
    if engine == "sglang":
        assert words[:4] == ["python3", "-m", "sglang_router.launch_router", "--worker-urls"]
        urls = words[4:words.index("--host")]
        assert {u.removeprefix("http://") for u in urls} == served and len(urls) == replicas
    else:
        assert words[1] == SPREAD_ROUTER and SPREAD_ROUTER in script.files
        args = spread_router.parser().parse_args(words[2:])
        assert {f"{h}:{p}" for h, p in zip(args.server_hosts, args.server_ports)} == served
        assert sorted(args.server_batches) == sorted(d["batch_per_replica"] for d in record["deployments"] for _ in range(d["replicas"]))
    assert f"send requests to its router on {routers[0].host} port {routers[0].port}" in export_plan(record, engine)


def test_one_replica_needs_no_router(solved_bundled):
    record = json.loads(json.dumps(solve_record(solved_bundled["llama-3.1-70b-hgx-h100"][1])))
    d = record["deployments"][0]
    record["deployments"] = [d | {"replicas": 1, "placement": [r for r in d["placement"] if r["replica"] == d["placement"][0]["replica"]]}]
    assert not [s for s in build_launch(as_plan(record), "vllm").servers if s.deployment < 0]


def test_kubernetes_spreads_an_aggregated_workload_with_a_service_over_every_leader(solved_bundled):
    record = solve_record(solved_bundled["llama-3.1-70b-hgx-h100"][1])
    docs = list(yaml.safe_load_all(export_plan(record, "lws", "vllm")))
    (service,) = [d for d in docs if d["kind"] == "Service"]
    selector = service["spec"]["selector"]
    leaders = [doc for doc in docs if doc["kind"] == "LeaderWorkerSet"]
    selected = 0
    for doc in leaders:
        template = doc["spec"]["leaderWorkerTemplate"]
        pod = template.get("leaderTemplate", template["workerTemplate"])
        if selector.items() - {"leaderworkerset.sigs.k8s.io/worker-index": "0"}.items() <= pod["metadata"]["labels"].items():
            selected += doc["spec"]["replicas"]
    assert selected == sum(d["replicas"] for d in record["deployments"])  # every group's leader, the only pod with worker index 0


def test_spread_fills_replicas_in_proportion_to_their_planned_batches():
    # batches 2 and 6, eight requests in flight: taken by fill fraction (ties to the first), by hand
    # 0/2 vs 0/6 -> 0; 1/2 vs 0/6 -> 1; 1/2 vs 1/6 -> 1; 1/2 vs 2/6 -> 1; 1/2 vs 3/6 -> 0; 2/2 vs 3/6 -> 1; -> 1; -> 1
    spread = spread_router.Spread(["a", "b"], [2, 6])
    assert [spread.take() for _ in range(8)] == [0, 1, 1, 1, 0, 1, 1, 1]
    spread.done(0)
    assert spread.take() == 0 and spread.in_flight == [2, 6]


def test_the_spread_router_forwards_answers_and_streams_to_its_replicas():
    seen: list[tuple[str, dict]] = []
    replicas = {name: FastAPI() for name in ("r0", "r1")}
    for name, app in replicas.items():
        @app.post("/v1/chat/completions")
        async def chat(request: Request, name=name):
            body = await request.json()
            seen.append((name, body))
            if body.get("stream"):
                return StreamingResponse(iter([b"data: a\n\n", b"data: [DONE]\n\n"]), media_type="text/event-stream")
            return {"choices": [{"message": {"content": f"from {name}"}}]}

    app = spread_router.make_app(["http://r0", "http://r1"], [1, 1])

    class ByHost(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request):
            return await httpx.ASGITransport(app=replicas[request.url.host]).handle_async_request(request)

    app.state.client = httpx.AsyncClient(transport=ByHost())
    with TestClient(app) as client:
        answer = client.post("/v1/chat/completions", json={"model": "m", "messages": [], "max_tokens": 5})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "from r0"
        streamed = client.post("/v1/chat/completions", json={"model": "m", "messages": [], "stream": True})
        assert streamed.text == "data: a\n\ndata: [DONE]\n\n"
        assert client.get("/health").status_code == 200
    assert [body.get("max_tokens") for _, body in seen] == [5, None]  # the request as sent
    assert app.state.spread.in_flight == [0, 0]  # every answer, streamed or not, released its replica
