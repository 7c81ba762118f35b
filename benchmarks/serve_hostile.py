"""Hostile requests for `planner serve`: malformed JSON, wrong types, huge numbers, huge bodies,
unknown fields, shell metacharacters and path tricks in names, sent to every endpoint (sweep jobs included). Seeded, so a
run is repeatable. Used by benchmarks/bench_serve.py (the full 1,000 against a live server) and by
tests/test_service_hostile.py (a bounded subset through FastAPI's TestClient).

A good answer is any status below 500 whose body holds no traceback."""

import json
import random
from urllib.parse import quote

__all__ = ["ENDPOINTS", "hostile_requests", "is_bad_answer"]

ENDPOINTS = ["solve", "estimate", "compare", "frontier", "curve", "check", "export", "view", "model"]
CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 131072}  # Llama 3.1 8B's config.json
INLINE = {"id": "m", "name": "m", "n_layers": 32, "hidden_size": 4096, "vocab_size": 128256, "dense_intermediate_size": 14336,
          "max_context_tokens": 131072, "attention": {"kind": "gqa", "n_heads": 32, "n_kv_heads": 8, "head_dim": 128}}
PROBLEM = {"name": "h", "model": "llama-3.1-70b", "cluster": {"racks": [{"type": "hgx-h100", "count": 1}]},
           "workloads": [{"name": "chat", "input_tokens": 2048, "output_tokens": 256, "tpot_limit_ms": 50}]}
SHELL = ["; rm -rf /", "$(id)", "`id`", "| cat /etc/passwd", "&& curl evil", "../../etc/passwd", "/etc/passwd", "~/.ssh/id_rsa",
         "deepseek-v3-gb200-nvl72/../../pyproject", "name\x00.yaml", "%2e%2e%2f", "C:\\Windows\\win.ini", "'; DROP TABLE x; --",
         "deepseek-v3-gb200-nvl72.yaml", "<script>alert(1)</script>", "\u202e\u0000", "*", "{{7*7}}", "${HOME}"]
HUGE = [1e308, -1e308, 10 ** 400, -(10 ** 30), 2 ** 63, 2 ** 64 + 1, 1e-320, -0.0, 0, -1, 4.5e15]
WRONG = [None, True, False, "", "x" * 300, [], [1, 2], {}, {"a": 1}, 3.5, "7", ["hgx-h100"]]
OPTIONS = ["time_limit", "seed", "workers", "confidence", "model", "rack", "tp", "ep", "pp", "batch", "isl", "osl", "racks", "count",
           "points", "workload", "min_tpot_ms", "format", "engine", "colour_by", "json", "plot", "output", "csv", "problem", "plan"]
DOC_PATHS = [("model",), ("cluster",), ("cluster", "racks"), ("cluster", "racks", 0, "type"), ("cluster", "racks", 0, "count"),
             ("workloads",), ("workloads", 0, "name"), ("workloads", 0, "input_tokens"), ("workloads", 0, "output_tokens"),
             ("workloads", 0, "tpot_limit_ms"), ("precisions",), ("objective",), ("engine",), ("solver",), ("name",)]


def _set(doc: dict, path: tuple, value) -> dict:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _encode(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _malformed(rng: random.Random) -> bytes:
    text = json.dumps({"problem": PROBLEM})
    kind = rng.randrange(7)
    if kind == 0:
        return text[:rng.randrange(1, len(text) - 1)].encode()  # cut short
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))  # random bytes, often not UTF-8
    if kind == 2:  # nested past the parser's recursion limit, or just below it (parses, then fails to re-encode)
        depth = rng.choice([100_000, 5000, 1000, 990, 900])
        return b'{"problem": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 3:
        return rng.choice([b"NaN", b"{\"problem\": NaN}", b"{\"problem\": Infinity}", b"{\"time_limit\": -Infinity}"])
    if kind == 4:
        return b"{\"problem\": \"a\", \"problem\": \"b\"" + b"}" * rng.randrange(0, 3)
    if kind == 5:
        return rng.choice([b"", b"null", b"[]", b"\"deepseek-v3-gb200-nvl72\"", b"123", b"true"])
    return ("{\"problem\": \"" + "\\ud800" * rng.randrange(1, 5) + "\"}").encode()  # lone surrogates


def _model(rng: random.Random) -> bytes:
    """A config.json to import, or a problem whose model is written inline, with fields of the wrong type or size."""
    base, keys = (CONFIG, list(CONFIG)) if rng.random() < 0.5 else (INLINE, [k for k in INLINE if k not in ("id", "name")])
    changed = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        changed[rng.choice(keys)] = rng.choice(WRONG + HUGE + [10 ** 30, 3, 1])
    if base is CONFIG:
        return _encode({"config": changed, "id": rng.choice(["m", "$(id)", "../x", ""])})
    return _encode({"problem": _set(PROBLEM, ("model",), {"inline": changed})})


def _body(rng: random.Random, endpoint: str) -> bytes:
    if endpoint == "model" or rng.random() < 0.04:
        return _model(rng)
    kind = rng.randrange(8)
    if kind == 0:
        return _malformed(rng)
    if kind == 1:  # a wrong type or a huge number in an option
        return _encode({"problem": "llama-3.1-70b-hgx-h100", rng.choice(OPTIONS): rng.choice(WRONG + HUGE)})
    if kind == 2:  # a wrong type or a huge number in a problem document's field
        return _encode({"problem": _set(PROBLEM, rng.choice(DOC_PATHS), rng.choice(WRONG + HUGE + SHELL))})
    if kind == 3:  # unknown fields, at the top or inside the document
        if rng.random() < 0.5:
            return _encode({"problem": "llama-3.1-70b-hgx-h100", rng.choice(SHELL + ["problme", "timelimit"]): 1})
        return _encode({"problem": _set(PROBLEM, ("workloads", 0, rng.choice(["inputs", "tpot_ms", "$(id)", "__class__"])), 1)})
    if kind == 4:  # shell metacharacters and path tricks where a name goes
        where = rng.randrange(4)
        name = rng.choice(SHELL)
        if where == 0:
            return _encode({"problem": name})
        if where == 1:
            return _encode({"problem": _set(PROBLEM, rng.choice([("model",), ("cluster", "racks", 0, "type")]), name)})
        if where == 2:
            return _encode({"problem": _set(PROBLEM, ("models",), {"m": {"config_json": name}}) | {"model": None}})
        return _encode({"plan": {"format": "llm-deployment-plan", "format_version": 1, "problem": name}, "format": name})
    if kind == 5:  # a huge body
        return b"{\"problem\": \"" + b"a" * rng.choice([1 << 20, 3 << 20]) + b"\"}"
    if kind == 6:  # a plan that is not a plan
        return _encode({"plan": rng.choice(WRONG + HUGE + [{"format": "llm-deployment-plan", "format_version": 1, "deployments": [{}]}])})
    return _encode(rng.choice(WRONG + HUGE))  # not an object at all


SWEEP = {"name": "h", "base": "llama-3.1-70b-hgx-h100", "racks": ["hgx-h100"], "time_limit_s": 1}
NOT_A_FIELD = ["; rm -rf /", "$(id)", "`id`", "../../etc/passwd", "/etc/passwd", "{{7*7}}", "${HOME}", "*", "a[", "a..b[x]"]


def _sweep(rng: random.Random) -> tuple[str, str, bytes]:
    """A sweep request every server refuses (none starts a job: a second job would be a 503, which
    the checks here count as bad): a base naming no bundled problem or a server file, an axis field
    that is no path, a wrong type beside an unknown field, too many points, or an id that names no job."""
    kind = rng.randrange(6)
    if kind == 0:  # not a dict: an inline base is a document, and the CLI solves a malformed one into INVALID rows
        return "POST", "/v1/sweeps", _encode(SWEEP | {"base": rng.choice([s for s in SHELL if not s.endswith(".yaml")] + [w for w in WRONG if not isinstance(w, dict)])})
    if kind == 1:
        return "POST", "/v1/sweeps", _encode(SWEEP | {"base": _set(PROBLEM, ("models",), {"m": {"config_json": rng.choice(SHELL)}}) | {"model": None}})
    if kind == 2:
        return "POST", "/v1/sweeps", _encode(SWEEP | {"axes": [{"field": rng.choice(NOT_A_FIELD), "values": [1]}]})
    if kind == 3:
        return "POST", "/v1/sweeps", _encode(SWEEP | {rng.choice(["mode", "axes", "racks", "time_limit_s", "seed"]): rng.choice(WRONG + HUGE),
                                                     rng.choice(SHELL + ["axis", "out", "workers"]): 1})
    if kind == 4:  # 256 x 256 points, over any server's limit of points per sweep
        return "POST", "/v1/sweeps", _encode(SWEEP | {"axes": [{"field": "solver.seed", "values": list(range(256))},
                                                               {"field": "workloads[0].input_tokens", "values": list(range(1, 257))}]})
    return rng.choice(["GET", "DELETE"]), "/v1/sweeps/" + quote(rng.choice(SHELL), safe="") + rng.choice(["", "/table", "/table?format=csv"]), b""


def hostile_requests(n: int, seed: int = 0) -> list[tuple[str, str, bytes]]:
    """`n` requests as (method, path, body): mostly POSTs to the endpoints, a few to unknown ones, a few
    sweep jobs submitted, polled or cancelled."""
    rng = random.Random(seed)
    requests = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.05:
            requests.append(("GET", "/v1/schema/" + quote(rng.choice(SHELL + ["problem", "../app"]), safe=""), b""))
        elif roll < 0.08:
            requests.append(("POST", "/v1/" + rng.choice(["shell", "..%2Fapp", "solve%00", "SOLVE"]), _body(rng, "solve")))
        elif roll < 0.13:
            requests.append(_sweep(rng))
        else:
            endpoint = rng.choice(ENDPOINTS)
            requests.append(("POST", f"/v1/{endpoint}", _body(rng, endpoint)))
    return requests


def is_bad_answer(status: int, text: str) -> bool:
    """A 5xx (the server broke, or it ran out of time: a request the generator makes must be refused
    or answered quickly), or a traceback in the body."""
    return status >= 500 or "Traceback" in text or "File \"/" in text
