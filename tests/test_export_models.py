"""Exports serve the model as the user named it (issue 24): a config.json model's repository, an inline
model's serving and pre-quantized repositories and remote code, in every launch script and every
Kubernetes flavour; the HF_TOKEN secret is required where the model is gated, whatever its repository's name."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from planner.model.catalog import load_model_specs
from planner.output.export import export_plan
from planner.output.plan_report import solve_record
from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem
from planner.solver.solve import solve

# Llama 3.1 8B's config.json (the architecture fields; meta-llama/Llama-3.1-8B-Instruct), with an auto_map entry
# as a repository that ships its own modelling code has
CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
          "auto_map": {"AutoModelForCausalLM": "modeling_mine.MineForCausalLM"}}
ENGINES = ("vllm", "sglang", "trtllm")


def _record(model: object, tmp_path: Path, weights: str = "bf16") -> dict:
    problem = {"name": "own-model", "model": model, "precisions": {"weights": weights, "kv_cache": "bf16"},
               "cluster": {"racks": [{"type": "hgx-h100", "count": 1}]},
               "workloads": [{"name": "chat", "input_tokens": 1024, "output_tokens": 128, "tpot_limit_ms": 50,
                              "demand": {"output_tokens_per_s": 2000}}], "engine": "vllm"}
    resolved = resolve_problem(parse_problem(problem), base_dir=tmp_path)
    return json.loads(json.dumps(solve_record(solve(resolved))))


def _model_words(text: str) -> list[tuple[str, bool]]:
    """(model, trusts remote code) of every engine command in a script or a manifest."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#") or not any(k in line for k in (" serve ", "sglang.launch_server", "trtllm-serve ")):
            continue
        words = shlex.split(line.split("- ", 1)[-1] if line.lstrip().startswith("- ") else line)
        model = words[words.index("--model-path") + 1] if "--model-path" in words else words[words.index("serve") + 1] \
            if "serve" in words else words[words.index("trtllm-serve") + 1]
        out.append((model, bool({"--trust-remote-code", "--trust_remote_code"} & set(words))))
    return out


def _exports(record: dict) -> dict[str, str]:
    out = {engine: export_plan(record, engine) for engine in ENGINES}
    out |= {f"lws-{engine}": export_plan(record, "lws", engine) for engine in ("vllm", "sglang", "trtllm")}
    return out


def test_a_config_json_model_serves_its_hf_repo_with_remote_code_from_auto_map(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    record = _record({"config_json": "config.json", "id": "mine-8b", "hf_repo": "acme/mine-8b-chat"}, tmp_path)
    for fmt, text in _exports(record).items():
        served = _model_words(text)
        assert served and set(served) == {("acme/mine-8b-chat", True)}, (fmt, served)  # not /models/mine-8b
        assert "no repository is named" not in text


def test_a_config_json_model_without_a_repository_says_where_to_put_the_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in CONFIG.items() if k != "auto_map"}))
    record = _record({"config_json": "config.json", "id": "mine-8b"}, tmp_path)
    text = export_plan(record, "vllm")
    assert set(_model_words(text)) == {("/models/mine-8b", False)}
    assert "NOTE: deployment 0: no repository is named for model mine-8b; the engines load /models/mine-8b" in text
    pods = [doc for doc in yaml.safe_load_all(export_plan(record, "lws", "vllm")) if doc["kind"] == "LeaderWorkerSet"]
    assert all("env" not in c for doc in pods for c in doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"])


def _inline(**fields) -> dict:
    spec = load_model_specs()["llama-3.1-8b"].model_dump(mode="json", exclude_none=True)
    for key in ("hf_repo", "serving_repo", "quantized_repos", "trust_remote_code", "gated"):
        spec.pop(key, None)
    return {"inline": spec | {"id": "mine-8b", **fields}}


@pytest.mark.parametrize("weights, served", [("bf16", "acme/mine-8b-chat"), ("fp8", "acme/mine-8b-chat-fp8")])
def test_an_inline_model_serves_its_serving_and_quantized_repos_with_remote_code(tmp_path, weights, served):
    model = _inline(hf_repo="acme/mine-8b", serving_repo="acme/mine-8b-chat", quantized_repos={"fp8": "acme/mine-8b-chat-fp8"},
                    trust_remote_code=True)
    record = _record(model, tmp_path, weights)
    for fmt, text in _exports(record).items():
        assert set(_model_words(text)) == {(served, True)}, fmt
        assert "--quantization" not in text  # a pre-quantized checkpoint: nothing to quantize at load time


def _hf_token(manifest: str) -> dict:
    pods = [doc["spec"]["leaderWorkerTemplate"]["workerTemplate"] for doc in yaml.safe_load_all(manifest) if doc["kind"] == "LeaderWorkerSet"]
    (token,) = {json.dumps(e["valueFrom"]["secretKeyRef"]) for p in pods for e in p["spec"]["containers"][0].get("env", [])}
    return json.loads(token)


def test_the_token_is_required_where_the_model_is_gated_not_where_its_name_looks_gated(tmp_path):
    gated = _record(_inline(hf_repo="acme/licensed-8b", gated=True), tmp_path)
    assert _hf_token(export_plan(gated, "lws", "vllm"))["optional"] is False
    # a repository under meta-llama/ of a model not marked gated (a mirror, say): the token is passed but not required
    ungated = _record(_inline(hf_repo="meta-llama/mirror-8b"), tmp_path)
    assert _hf_token(export_plan(ungated, "lws", "vllm"))["optional"] is True


def test_the_catalog_marks_the_models_whose_repositories_hugging_face_gates():
    # the model pages ask to accept the Llama licence (meta-llama/...) and the Falcon-180B TII licence (tiiuae/falcon-180B)
    specs = load_model_specs()
    assert {k for k, s in specs.items() if s.gated} == {k for k in specs if k.startswith(("llama-", "falcon-"))}


@pytest.mark.parametrize("fmt", ["sglang", "lws"])
def test_sglang_gets_no_expert_map_for_llama_4_and_the_export_says_so(solved_bundled, fmt):
    # SGLang's Llama 4 class has no get_model_config_for_expert_location, so a given map cannot be loaded (issue 24)
    record = solve_record(solved_bundled["long-context-llama-4-maverick"][1])
    assert any(d.get("expert_map") for d in record["deployments"])
    text = export_plan(record, fmt, "sglang") if fmt == "lws" else export_plan(record, fmt)
    assert "--init-expert-location" not in text and "expert_map_" not in text and "--ep-num-redundant-experts" not in text
    mapped = next(i for i, d in enumerate(record["deployments"]) if d.get("expert_map"))
    assert f"NOTE: deployment {mapped}: SGLang's llama4 model takes no expert placement" in text
    ep = record["deployments"][mapped]["ep"]
    assert f"expert e on expert-parallel rank e // {128 // ep}" in text  # 128 experts over the EP ranks, in checkpoint order
    # a model whose SGLang class takes a placement keeps it
    deepseek = export_plan(solve_record(solved_bundled["deepseek-v3-wide-ep-skewed"][1]), "sglang")
    assert "--init-expert-location" in deepseek and "takes no expert placement" not in deepseek
