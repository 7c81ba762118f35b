"""Hostile requests against the service (benchmarks/serve_hostile.py: malformed JSON, wrong types,
huge numbers and bodies, unknown fields, shell metacharacters and path tricks in names): a seeded
subset of 150 here, the full 1,000 in benchmarks/bench_serve.py. None may answer 5xx or show a traceback."""

import collections
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service's extra (fastapi) is not installed: pip install '.[serve]'")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx: pip install '.[test]'")
from fastapi.testclient import TestClient

from planner.service.app import create_app

_SPEC = importlib.util.spec_from_file_location("serve_hostile", Path(__file__).resolve().parents[1] / "benchmarks" / "serve_hostile.py")
hostile = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(hostile)


def test_150_hostile_requests_are_refused_without_a_5xx_or_a_traceback():
    requests = hostile.hostile_requests(150, seed=23)
    statuses = collections.Counter()
    bad = []
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        for method, path, body in requests:
            answer = client.request(method, path, content=body, headers={"content-type": "application/json"})
            statuses[answer.status_code] += 1
            if hostile.is_bad_answer(answer.status_code, answer.text):
                bad.append((method, path, body[:120], answer.status_code, answer.text[:200]))
    assert bad == []
    assert statuses[400] > 100 and statuses[413] > 0 and statuses[404] > 0, statuses  # the subset reaches each kind of refusal


def test_a_model_too_large_to_compute_with_is_an_input_error():
    # 10^400 hidden units once passed validation and overflowed a float in the step model; the model
    # schema now bounds every size (hidden_size <= 2^20, far beyond any published model)
    inline = hostile.INLINE | {"hidden_size": 10 ** 400}
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        answer = client.post("/v1/solve", json={"problem": hostile.PROBLEM | {"model": {"inline": inline}}})
        issue = answer.json()["issues"][0]
        assert answer.status_code == 400 and issue["field"] == "model.inline.hidden_size" and "1048576" in issue["problem"]
        config = client.post("/v1/model", json={"config": hostile.CONFIG | {"hidden_size": "x", "num_attention_heads": []}})
        fields = [i["field"] for i in config.json()["issues"]]
        assert config.status_code == 400 and fields == ["config: hidden_size", "config: num_attention_heads"]


def test_the_failures_a_hostile_request_finds_are_answered_as_input_errors():
    with TestClient(create_app(), raise_server_exceptions=False) as client:
        for body in (b"[" * 100_000 + b"]" * 100_000, b'{"problem": ' + b"[" * 990 + b"]" * 990 + b"}", b'{"problem": "\\ud800"}', b"\xff\xfe", b'{"problem": NaN}', b'{"time_limit": 1e999}'):
            answer = client.post("/v1/solve", content=body)
            assert answer.status_code == 400 and answer.json()["issues"][0]["field"] in ("(body)", "problem"), (body[:40], answer.text)


def test_hostile_sweep_requests_are_refused_and_start_no_job():
    import random

    rng = random.Random(7)
    app = create_app()
    with TestClient(app, raise_server_exceptions=False) as client:
        for _ in range(120):
            method, path, body = hostile._sweep(rng)
            answer = client.request(method, path, content=body, headers={"content-type": "application/json"})
            assert 400 <= answer.status_code < 500 and not hostile.is_bad_answer(answer.status_code, answer.text), (path, body[:120], answer.text[:200])
        assert app.state.sweeps.running() == 0
