"""Export a solved plan (the JSON `planner solve --json` writes) for serving stacks.

Formats:
- `json`: the placement document (format "llm-deployment-placement", version 1): for every
  deployment its layout and, per replica, one entry per accelerator with its rack, host, role,
  pipeline layers and the experts it holds in each MoE layer; plus the EPLB-style expert map.
- `vllm`, `sglang`, `trtllm`: a shell script with one launch command per host of every replica,
  auxiliary files (expert maps, engine YAML) written by heredocs. Flag names follow each engine's
  documentation: vLLM `docs/serving/expert_parallel_deployment.md` and `data_parallel_deployment.md`;
  SGLang server arguments (`--tp-size`, `--dp-size`, `--enable-dp-attention`, `--ep-size`,
  `--init-expert-location` with a `physical_to_logical_map`); TensorRT-LLM `trtllm-serve` options and
  its `moe_load_balancer.yaml` (`num_slots`, `initial_global_assignments`). What an engine cannot
  express is written as a `# NOTE` line in the script.

Physical expert slots are numbered rank-major: slot p lives on expert-parallel rank p // slots_per_rank.
"""

import json
import shlex
from collections import OrderedDict
from dataclasses import dataclass

from planner import __version__
from planner.hardware.catalog import load_hardware_catalog
from planner.model.catalog import load_model_catalog

__all__ = ["export_plan", "placement_document"]

PLACEMENT_FORMAT = "llm-deployment-placement"
PLACEMENT_FORMAT_VERSION = 1
BASE_PORT = 8000
RENDEZVOUS_PORT = 13345
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default; each server on a host needs its own


@dataclass(frozen=True)
class Host:
    name: str  # "<rack-id>#<instance>/host<k>"
    local_indices: tuple[int, ...]  # accelerator indices on that host


def _host_size(record: dict, rack_instance: str) -> int:
    """Accelerators per host: from the plan's rack list (custom racks included), else the catalog."""
    info = (record.get("racks") or {}).get(rack_instance, {})
    if info.get("accelerators_per_host"):
        return int(info["accelerators_per_host"])
    rack = load_hardware_catalog().racks.get(rack_instance.split("#")[0])
    return rack.host_size if rack else 1


def _hosts(record: dict, roles: list[dict]) -> list[Host]:
    """Hosts of a replica's accelerators, in placement order."""
    hosts: OrderedDict[str, list[int]] = OrderedDict()
    for role in roles:
        rack, index = role["accelerator"].rsplit("/", 1)
        size = _host_size(record, rack)
        host = f"{rack}/host{int(index) // size}"
        hosts.setdefault(host, []).append(int(index) % size)
    return [Host(name, tuple(idx)) for name, idx in hosts.items()]


def _replicas(d: dict) -> list[list[dict]]:
    by_replica: OrderedDict[int, list[dict]] = OrderedDict()
    for role in d.get("placement", []):
        by_replica.setdefault(role["replica"], []).append(role)
    return list(by_replica.values())


def _experts_of(d: dict, role: dict) -> dict[str, list[int]]:
    """Logical experts an accelerator holds in each MoE layer of its stage."""
    emap = d.get("expert_map")
    if not emap or role.get("ep_rank") is None:
        return {}
    slots, rank = emap["slots_per_rank"], role["ep_rank"]
    moe_layers = {layer["layer"] for layer in emap["layers"]}
    first, last = role["layers"]
    return {str(layer): emap["physical_to_logical_map"][layer][rank * slots:(rank + 1) * slots]
            for layer in range(first, last) if layer in moe_layers}


def placement_document(record: dict) -> dict:
    """The `json` export: every accelerator of every replica with its role and experts."""
    deployments = []
    for i, d in enumerate(record["deployments"]):
        replicas = []
        for roles in _replicas(d):
            entries = []
            for role in roles:
                entry = {k: role[k] for k in ("accelerator", "rack", "stage", "layers", "tp_rank", "dp_rank", "ep_rank", "expert_tp_rank")}
                index = int(role["accelerator"].rsplit("/", 1)[1])
                entry["host"] = f"{role['rack']}/host{index // _host_size(record, role['rack'])}"
                entry["role"] = _role_text(role)
                entry["experts_per_layer"] = _experts_of(d, role)
                entries.append(entry)
            replicas.append({"replica": roles[0]["replica"], "accelerators": entries})
        emap = d.get("expert_map")
        deployments.append({
            "id": f"{d['workload']}-{i}",
            "workload": d["workload"],
            "model": d["model"],
            "rack": d["rack"],
            "role": d.get("role", "aggregated"),
            "accelerator_type": d["accelerator"],
            "layout": {k: d[k] for k in ("tp", "ep", "pp", "dp_attn", "expert_tp")},
            "batch_per_replica": d["batch_per_replica"],
            "precisions": d["precisions"],
            "replicas": replicas,
            "expert_map": None if emap is None else {
                "num_ep_ranks": emap["n_ranks"], "slots_per_rank": emap["slots_per_rank"],
                "num_physical_experts": emap["n_ranks"] * emap["slots_per_rank"],
                "physical_to_logical_map": emap["physical_to_logical_map"],
            },
        })
    return {
        "format": PLACEMENT_FORMAT,
        "format_version": PLACEMENT_FORMAT_VERSION,
        "generated_by": f"planner {__version__}",
        "problem": record.get("problem"),
        "deployments": deployments,
    }


def _role_text(role: dict) -> str:
    text = f"stage {role['stage']} (layers {role['layers'][0]}-{role['layers'][1] - 1}), attention dp {role['dp_rank']} tp {role['tp_rank']}"
    if role.get("ep_rank") is not None:
        text += f", expert rank {role['ep_rank']}"
    return text


# ---------------------------------------------------------------------------------------------
# launch scripts


def _model_path(model_id: str) -> str:
    """Hugging Face repository of a catalog model, or a placeholder for imported models."""
    return _hf_repos().get(model_id, f"<path-to-{model_id}>")


def _hf_repos() -> dict[str, str]:
    import yaml

    from planner.paths import data_dir

    repos = {}
    for path in sorted(data_dir("models").glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text()).get("models", []):
            if entry.get("hf_repo"):
                repos[entry["id"]] = entry["hf_repo"]
    return repos


def _workload(record: dict, name: str) -> dict:
    return next(w for w in record.get("problem_spec", {}).get("workloads", []) if w["name"] == name)


def _max_len(record: dict, d: dict) -> int:
    w = _workload(record, d["workload"])
    return int(w["input_tokens"]) + int(w["output_tokens"])


def _heredoc(path: str, text: str) -> list[str]:
    return [f"cat > {shlex.quote(path)} <<'PLANNER_EOF'", text.rstrip("\n"), "PLANNER_EOF"]


def _command(parts: list[str]) -> str:
    return " \\\n    ".join(parts)


def _expert_map_json(d: dict) -> str:
    return json.dumps({"physical_to_logical_map": d["expert_map"]["physical_to_logical_map"]})


def _redundant(d: dict) -> int:
    """Physical expert slots beyond one per logical expert (the engines' global redundant count)."""
    emap = d.get("expert_map")
    if not emap:
        return 0
    return emap["n_ranks"] * emap["slots_per_rank"] - emap["n_logical_experts"]


def _vllm(record: dict, d: dict, index: int, lines: list[str]) -> None:
    model = _model_path(d["model"])
    prec = d["precisions"]
    tp, dp, ep, pp = d["tp"], d["dp_attn"], d["ep"], d["pp"]
    stage = tp * dp
    if ep not in (1, stage):
        lines.append(f"# NOTE: vLLM sets EP = TP x DP when --enable-expert-parallel is on; the plan's EP {ep} becomes {stage}.")
    for roles in _replicas(d):
        hosts = _hosts(record, roles)
        port = BASE_PORT + index * 100 + roles[0]["replica"]
        spans_hosts = len(hosts) > 1
        tp_or_pp_spans = spans_hosts and (pp > 1 or tp > len(hosts[0].local_indices))
        lines.append(f"# {d['workload']} replica {roles[0]['replica']}: {len(roles)} accelerators on {', '.join(h.name for h in hosts)}")
        if tp_or_pp_spans:
            lines.append("# NOTE: tensor or pipeline groups cross hosts: start a Ray cluster over these hosts, then run on its head:")
        base = [f"vllm serve {model}", f"--tensor-parallel-size {tp}", f"--pipeline-parallel-size {pp}",
                f"--max-num-seqs {max(1, d['batch_per_replica'] // dp)}", f"--max-model-len {_max_len(record, d)}", f"--port {port}"]
        if prec["kv_cache"].startswith("fp8"):
            base.append("--kv-cache-dtype fp8")
        if prec["weights"] == "fp8" and d["model"] in _bf16_native():
            base.append("--quantization fp8")
        if ep > 1 and ep == stage:
            base.append("--enable-expert-parallel")
        if _redundant(d):
            base += ["--enable-eplb", f"--eplb-config '{json.dumps({'num_redundant_experts': _redundant(d)})}'"]
        role = d.get("role", "aggregated")
        if role != "aggregated":  # vLLM docs/features/nixl_connector_usage.md
            kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
            base.append(f"--kv-transfer-config '{json.dumps({'kv_connector': 'NixlConnector', 'kv_role': kv_role})}'")
            side_port = NIXL_SIDE_CHANNEL_PORT + index * 100 + roles[0]["replica"]  # unique per server on a host
            base[0] = f"VLLM_NIXL_SIDE_CHANNEL_HOST=<{hosts[0].name}> VLLM_NIXL_SIDE_CHANNEL_PORT={side_port} " + base[0]
        if tp_or_pp_spans:
            lines += [_command(base + ([f"--data-parallel-size {dp}"] if dp > 1 else []) + ["--distributed-executor-backend ray"]), ""]
            continue
        start = 0
        for h, host in enumerate(hosts):
            local_dp = len(host.local_indices) // tp
            devices = ",".join(map(str, host.local_indices))
            parts = [f"# on {host.name}", f"CUDA_VISIBLE_DEVICES={devices} " + base[0]] + base[1:]
            if dp > 1:
                parts += [f"--data-parallel-size {dp}", f"--data-parallel-size-local {local_dp}"]
                if spans_hosts:
                    parts += [f"--data-parallel-address <{hosts[0].name}>", f"--data-parallel-rpc-port {RENDEZVOUS_PORT}"]
                    if h:
                        parts += [f"--data-parallel-start-rank {start}", "--headless"]
            lines += [parts[0], _command(parts[1:]), ""]
            start += local_dp


def _bf16_native() -> set[str]:
    return {m.id for m in load_model_catalog().values() if m.native_weights_precision in ("bf16", "fp16")}


def _sglang(record: dict, d: dict, index: int, lines: list[str]) -> None:
    model = _model_path(d["model"])
    prec = d["precisions"]
    tp, dp, ep, pp = d["tp"], d["dp_attn"], d["ep"], d["pp"]
    map_file = None
    if d.get("expert_map"):
        map_file = f"expert_map_{d['workload']}_{index}.json"
        lines += _heredoc(map_file, _expert_map_json(d)) + [""]
    for roles in _replicas(d):
        hosts = _hosts(record, roles)
        port = BASE_PORT + index * 100 + roles[0]["replica"]
        lines.append(f"# {d['workload']} replica {roles[0]['replica']}: {len(roles)} accelerators on {', '.join(h.name for h in hosts)}")
        base = ["python -m sglang.launch_server", f"--model-path {model}", f"--tp-size {tp * dp}", f"--pp-size {pp}",
                f"--max-running-requests {d['batch_per_replica']}", f"--context-length {_max_len(record, d)}", f"--port {port}"]
        if dp > 1:
            base += [f"--dp-size {dp}", "--enable-dp-attention"]
        if ep > 1:
            base += [f"--ep-size {ep}", "--moe-a2a-backend deepep"]
        if prec["kv_cache"].startswith("fp8"):
            base.append("--kv-cache-dtype fp8_e4m3")
        if prec["weights"] == "fp8" and d["model"] in _bf16_native():
            base.append("--quantization fp8")
        if map_file:
            base += [f"--init-expert-location {map_file}", "--ep-dispatch-algorithm static"]
            if _redundant(d):
                base.append(f"--ep-num-redundant-experts {_redundant(d)}")
        if d.get("role", "aggregated") != "aggregated":  # SGLang docs/advanced_features/pd_disaggregation.md
            base += [f"--disaggregation-mode {d['role']}", "--disaggregation-transfer-backend nixl", f"--host <{hosts[0].name}>"]
        for h, host in enumerate(hosts):
            parts = [f"# on {host.name}", f"CUDA_VISIBLE_DEVICES={','.join(map(str, host.local_indices))} " + base[0]] + base[1:]
            if len(hosts) > 1:
                parts += [f"--nnodes {len(hosts)}", f"--node-rank {h}", f"--dist-init-addr <{hosts[0].name}>:{RENDEZVOUS_PORT}"]
            lines += [parts[0], _command(parts[1:]), ""]


def _trtllm(record: dict, d: dict, index: int, lines: list[str]) -> None:
    model = _model_path(d["model"])
    prec = d["precisions"]
    tp, dp, ep, pp = d["tp"], d["dp_attn"], d["ep"], d["pp"]
    extra = [f"enable_attention_dp: {'true' if dp > 1 else 'false'}"]
    role = d.get("role", "aggregated")
    if role != "aggregated":  # TensorRT-LLM docs/source/features/disagg-serving.md
        if role == "prefill":
            extra.append("disable_overlap_scheduler: true")
        extra += ["cache_transceiver_config:", "  backend: UCX", f"  max_tokens_in_buffer: {_workload(record, d['workload'])['input_tokens']}"]
    if dp > 1 and tp > 1:
        lines.append(f"# NOTE: TensorRT-LLM attention data parallelism runs attention unsharded; the plan's attention TP {tp} becomes 1.")
    if prec["kv_cache"].startswith("fp8"):
        extra += ["kv_cache_config:", "  dtype: fp8"]
    if d.get("expert_map"):
        balancer = f"moe_load_balancer_{d['workload']}_{index}.yaml"
        emap = d["expert_map"]
        body = [f"num_slots: {emap['n_ranks'] * emap['slots_per_rank']}", "layer_updates_per_iter: 0", "initial_global_assignments:"]
        body += [f"  {layer['layer']}: {json.dumps(emap['physical_to_logical_map'][layer['layer']])}" for layer in emap["layers"]]
        lines += _heredoc(balancer, "\n".join(body)) + [""]
        extra += ["moe_config:", f"  load_balancer: {balancer}"]
    extra_file = f"extra_llm_api_options_{d['workload']}_{index}.yaml"
    lines += _heredoc(extra_file, "\n".join(extra)) + [""]
    for roles in _replicas(d):
        hosts = _hosts(record, roles)
        port = BASE_PORT + index * 100 + roles[0]["replica"]
        lines.append(f"# {d['workload']} replica {roles[0]['replica']}: {len(roles)} accelerators on {', '.join(h.name for h in hosts)}")
        serve = [f"trtllm-serve {model}", "--backend pytorch", f"--tp_size {tp * dp}", f"--pp_size {pp}", f"--ep_size {ep}",
                 f"--max_batch_size {max(1, d['batch_per_replica'] // dp)}", f"--max_seq_len {_max_len(record, d)}",
                 f"--extra_llm_api_options {extra_file}", f"--port {port}"]
        if len(hosts) > 1:
            host_list = ",".join(f"<{h.name}>:{len(h.local_indices)}" for h in hosts)
            lines += [_command([f"mpirun -n {len(roles)} --host {host_list} trtllm-llmapi-launch " + serve[0]] + serve[1:]), ""]
        else:
            lines += [_command([f"CUDA_VISIBLE_DEVICES={','.join(map(str, hosts[0].local_indices))} " + serve[0]] + serve[1:]), ""]


_SCRIPTS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}


def export_plan(record: dict, fmt: str) -> str:
    """The plan in `fmt` (an ExportFormat value) as text."""
    if fmt == "json":
        return json.dumps(placement_document(record), indent=2) + "\n"
    lines = ["#!/usr/bin/env bash", f"# {fmt} launch commands for plan '{record.get('problem')}', generated by planner {__version__}.",
             "# One command per host of every replica; replace <host> placeholders with addresses.", "set -euo pipefail", ""]
    for i, d in enumerate(record["deployments"]):
        role = d.get("role", "aggregated")
        lines.append(f"# ---- deployment {i}: {d['workload']} ({d['model']}) on {d['rack']}, {d['replicas']} {role} replica(s), "
                     f"TP{d['tp']} DPattn{d['dp_attn']} EP{d['ep']} PP{d['pp']}, batch {d['batch_per_replica']}")
        _SCRIPTS[fmt](record, d, i, lines)
    for workload in dict.fromkeys(d["workload"] for d in record["deployments"]):
        _ROUTERS[fmt](record, workload, lines)
    return "\n".join(lines) + "\n"


def _pool_endpoints(record: dict, workload: str, role: str) -> list[str]:
    """<host>:port of the first host of every replica of `workload` in `role`, in deployment order."""
    out = []
    for index, d in enumerate(record["deployments"]):
        if d["workload"] != workload or d.get("role", "aggregated") != role:
            continue
        for roles in _replicas(d):
            out.append(f"<{_hosts(record, roles)[0].name}>:{BASE_PORT + index * 100 + roles[0]['replica']}")
    return out


def _vllm_router(record: dict, workload: str, lines: list[str]) -> None:
    prefill, decode = _pool_endpoints(record, workload, "prefill"), _pool_endpoints(record, workload, "decode")
    if not prefill:
        return
    lines += [(f"# {workload}: route requests through vLLM's example proxy for disaggregated prefill "
              "(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py in the vLLM source tree)"),
              _command(["python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "--port 8192",
                        "--prefiller-hosts " + " ".join(e.rsplit(":", 1)[0] for e in prefill),
                        "--prefiller-ports " + " ".join(e.rsplit(":", 1)[1] for e in prefill),
                        "--decoder-hosts " + " ".join(e.rsplit(":", 1)[0] for e in decode),
                        "--decoder-ports " + " ".join(e.rsplit(":", 1)[1] for e in decode)]), ""]


def _sglang_router(record: dict, workload: str, lines: list[str]) -> None:
    prefill, decode = _pool_endpoints(record, workload, "prefill"), _pool_endpoints(record, workload, "decode")
    if not prefill:
        return
    lines += [f"# {workload}: the SGLang router pairs prefill and decode servers",
              _command(["python -m sglang_router.launch_router --pd-disaggregation", *(f"--prefill http://{e}" for e in prefill),
                        *(f"--decode http://{e}" for e in decode), "--host 0.0.0.0", "--port 8192"]), ""]


def _trtllm_router(record: dict, workload: str, lines: list[str]) -> None:
    prefill, decode = _pool_endpoints(record, workload, "prefill"), _pool_endpoints(record, workload, "decode")
    if not prefill:
        return
    config = ["hostname: 0.0.0.0", "port: 8192", "backend: pytorch", "context_servers:", f"  num_instances: {len(prefill)}", "  urls:"]
    config += [f'    - "{e}"' for e in prefill]
    config += ["generation_servers:", f"  num_instances: {len(decode)}", "  urls:"] + [f'    - "{e}"' for e in decode]
    path = f"disagg_config_{workload}.yaml"
    lines += [f"# {workload}: the disaggregated server dispatches context and generation requests"]
    lines += _heredoc(path, "\n".join(config)) + [f"trtllm-serve disaggregated -c {path}", ""]


_ROUTERS = {"vllm": _vllm_router, "sglang": _sglang_router, "trtllm": _trtllm_router}
