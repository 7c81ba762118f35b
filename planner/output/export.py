"""Export a solved plan (the JSON `planner solve --json` writes) for serving stacks.

Formats:
- `json`: the placement document (format "llm-deployment-placement", version 1): for every
  deployment its layout and, per replica, one entry per accelerator with its rack, host, role,
  pipeline layers and the experts it holds in each MoE layer; plus the EPLB-style expert map.
- `lws`: Kubernetes LeaderWorkerSet manifests running the same commands (planner/output/kubernetes.py).
- `vllm`, `sglang`, `trtllm`: a launch script run on every host with `--host NAME`, which starts
  that host's servers (planner/output/launch.py; the servers of each engine in
  planner/output/engines.py). What an engine cannot express is written as a `# NOTE` line.

Physical expert slots are numbered rank-major: slot p lives on expert-parallel rank p // slots_per_rank.
"""

import json
from pathlib import Path

from planner import __version__
from planner.errors import InputIssue, PlannerInputError
from planner.modes import ServingRole
from planner.output.engine_note import engine_mismatch_notes
from planner.output.engines import (
    ENGINE_BUILDERS,
    ENGINE_VERSIONS,
    ROUTER_PORT,
    Ports,
    host_size,
    hosts_of,
    replicas_of,
    vendor_of,
)
from planner.output.kubernetes import group_endpoints, manifests_text
from planner.output.launch import HostRef, LaunchScript, Server, render_script, word
from planner.output.launch import safe_file_name as safe_name
from planner.output.plan import Plan, PlanDeployment, as_plan
from planner.output.plan_records import PlacedAccelerator

__all__ = ["SPREAD_ROUTER", "VLLM_ROUTER", "export_plan", "placement_document"]

PLACEMENT_FORMAT = "llm-deployment-placement"
PLACEMENT_FORMAT_VERSION = 1
VLLM_ROUTER = "vllm_pd_router.py"  # the prefill/decode router of vLLM exports, in planner/output/files/
SPREAD_ROUTER = "spread_router.py"  # the router over aggregated replicas of vLLM and TensorRT-LLM scripts, beside it


def _experts_of(d: PlanDeployment, role: PlacedAccelerator) -> dict[str, list[int]]:
    """Logical experts an accelerator holds in each MoE layer of its stage."""
    emap = d.expert_map
    if not emap or role.ep_rank is None:
        return {}
    moe_layers = set(emap.moe_layers)
    first, last = role.layers
    return {str(layer): emap.rank_slots(layer)[role.ep_rank] for layer in range(first, last) if layer in moe_layers}


def _placed_entry(plan: Plan, d: PlanDeployment, role: PlacedAccelerator) -> dict:
    """One accelerator of the `json` export: where it is, its ranks, its host, its role and its experts."""
    return {"accelerator": role.accelerator, "rack": role.rack, "stage": role.stage, "layers": list(role.layers), "tp_rank": role.tp_rank,
            "dp_rank": role.dp_rank, "ep_rank": role.ep_rank, "expert_tp_rank": role.expert_tp_rank,
            "host": f"{role.rack}/host{role.index // host_size(plan, role.rack)}", "role": _role_text(role), "experts_per_layer": _experts_of(d, role)}


def _placement_deployment(plan: Plan, d: PlanDeployment, i: int) -> dict:
    replicas = [{"replica": roles[0].replica, "accelerators": [_placed_entry(plan, d, role) for role in roles]} for roles in replicas_of(d)]
    emap = d.expert_map
    return {
        "id": f"{d.workload}-{i}",
        "workload": d.workload,
        "model": d.model,
        "rack": d.rack,
        "role": str(d.role),
        "accelerator_type": d.accelerator,
        "layout": {"tp": d.tp, "ep": d.ep, "pp": d.pp, "dp_attn": d.dp_attn, "expert_tp": d.expert_tp},
        "batch_per_replica": d.batch_per_replica,
        "precisions": d.precisions.model_dump(mode="json"),
        "replicas": replicas,
        "expert_map": None if emap is None else {
            "num_ep_ranks": emap.n_ranks, "slots_per_rank": emap.slots_per_rank,
            "num_physical_experts": emap.n_ranks * emap.slots_per_rank,
            "physical_to_logical_map": emap.physical_to_logical_map,
        },
    }


def placement_document(plan: Plan | dict) -> dict:
    """The `json` export: every accelerator of every replica with its role and experts."""
    plan = as_plan(plan)
    return {
        "format": PLACEMENT_FORMAT,
        "format_version": PLACEMENT_FORMAT_VERSION,
        "generated_by": f"planner {__version__}",
        "problem": plan.problem,
        "deployments": [_placement_deployment(plan, d, i) for i, d in enumerate(plan.deployments)],
    }


def _role_text(role: PlacedAccelerator) -> str:
    text = f"stage {role.stage} (layers {role.layers[0]}-{role.layers[1] - 1}), attention dp {role.dp_rank} tp {role.tp_rank}"
    if role.ep_rank is not None:
        text += f", expert rank {role.ep_rank}"
    return text


# ---------------------------------------------------------------------------------------------
# launch scripts


def _unsupported(plan: Plan, fmt: str) -> None:
    """Refuse an engine that cannot run on the plan's accelerators, before anything is written."""
    for i, d in enumerate(plan.deployments):
        vendor = vendor_of(plan, d.accelerator)
        if fmt == "trtllm" and vendor != "NVIDIA":
            raise PlannerInputError(InputIssue(f"deployments[{i}]", f"TensorRT-LLM runs on NVIDIA GPUs only; {d.accelerator} is {vendor}",
                                               "export --format vllm or sglang (both have ROCm builds)"))
        if vendor not in ("NVIDIA", "AMD"):
            raise PlannerInputError(InputIssue(f"deployments[{i}]", f"no {fmt} launch script for {vendor} {d.accelerator} accelerators",
                                               "export --format json and start the engine's own TPU / Neuron build from the placement"))


def _routers(plan: Plan, fmt: str, script: LaunchScript, ports: Ports) -> None:
    """One request router per disaggregated workload, on the host of its first prefill server."""
    for workload in dict.fromkeys(d.workload for d in plan.deployments):
        prefill, decode = script.endpoints.get((workload, "prefill"), []), script.endpoints.get((workload, "decode"), [])
        if not prefill or not decode:
            continue
        host = prefill[0][0]
        port = ports.take(host, ROUTER_PORT)
        if fmt == "sglang":
            argv = [word("python3"), word("-m"), word("sglang_router.launch_router"), word("--pd-disaggregation")]
            for h, p, bootstrap in prefill:
                argv += [word("--prefill"), word("http://", HostRef(h), f":{p}"), word(bootstrap)]
            for h, p, _ in decode:
                argv += [word("--decode"), word("http://", HostRef(h), f":{p}")]
            argv += [word("--host"), word("0.0.0.0"), word("--port"), word(port)]
        elif fmt == "trtllm":
            config = safe_name(f"disagg_config_{workload}.yaml")
            lines = [word("hostname: 0.0.0.0"), word(f"port: {port}"), word("backend: pytorch"), word("context_servers:"),
                     word(f"  num_instances: {len(prefill)}"), word("  urls:")]
            lines += [word('    - "', HostRef(h), f':{p}"') for h, p, _ in prefill]
            lines += [word("generation_servers:"), word(f"  num_instances: {len(decode)}"), word("  urls:")]
            lines += [word('    - "', HostRef(h), f':{p}"') for h, p, _ in decode]
            script.generated_files[config] = lines
            argv = [word("trtllm-serve"), word("disaggregated"), word("-c"), word(config)]
        else:  # our own router (planner/output/files/), shipped with the other files: nothing to copy by hand
            script.files[VLLM_ROUTER] = (Path(__file__).parent / "files" / VLLM_ROUTER).read_text()
            argv = [word("python3"), word(VLLM_ROUTER), word("--host"), word("0.0.0.0"), word("--port"), word(port)]
            argv += [word("--prefiller-hosts"), *(word(HostRef(h)) for h, _, _ in prefill)]
            argv += [word("--prefiller-ports"), *(word(p) for _, p, _ in prefill)]
            argv += [word("--decoder-hosts"), *(word(HostRef(h)) for h, _, _ in decode)]
            argv += [word("--decoder-ports"), *(word(p) for _, p, _ in decode)]
        # the vLLM router answers on /healthcheck (planner/output/files/vllm_pd_router.py)
        script.servers.append(Server(host, f"router-{workload}", argv, port, "/healthcheck" if fmt == "vllm" else "/health"))


def _spreaders(plan: Plan, fmt: str, script: LaunchScript, ports: Ports) -> None:
    """A router per aggregated workload of several replicas, on its first replica's host, spreading requests
    over every replica: SGLang's own (sglang_router, regular mode), else ours (planner/output/files/)."""
    for workload in dict.fromkeys(d.workload for d in plan.deployments):
        heads = [s for s in script.servers if s.deployment >= 0 and s.port is not None and s.host_rank == 0
                 and plan.deployments[s.deployment].workload == workload
                 and plan.deployments[s.deployment].role is ServingRole.AGGREGATED]
        if len(heads) < 2:
            continue
        host, port = heads[0].host, ports.take(heads[0].host, ROUTER_PORT)
        if fmt == "sglang":
            argv = [word("python3"), word("-m"), word("sglang_router.launch_router"), word("--worker-urls")]
            argv += [word("http://", HostRef(s.host), f":{s.port}") for s in heads]
        else:
            script.files[SPREAD_ROUTER] = (Path(__file__).parent / "files" / SPREAD_ROUTER).read_text()
            argv = [word("python3"), word(SPREAD_ROUTER), word("--server-hosts"), *(word(HostRef(s.host)) for s in heads)]
            argv += [word("--server-ports"), *(word(s.port) for s in heads)]
            argv += [word("--server-batches"), *(word(plan.deployments[s.deployment].batch_per_replica) for s in heads)]
        argv += [word("--host"), word("0.0.0.0"), word("--port"), word(port)]
        script.servers.append(Server(host, f"router-{workload}", argv, port, "/health"))
        script.header.append(f"workload {workload}: send requests to its router on {host} port {port}, which spreads them over its "
                             f"{len(heads)} replicas")


def build_launch(plan: Plan, fmt: str, routers: bool = True) -> LaunchScript:
    """The servers, files and notes of the plan for engine `fmt` (see planner/output/launch.py)."""
    _unsupported(plan, fmt)
    hosts = list(dict.fromkeys(h.name for d in plan.deployments for roles in replicas_of(d) for h in hosts_of(plan, roles)))
    header = [f"{ENGINE_VERSIONS[fmt]} launch script for plan '{plan.problem}', generated by planner {__version__}.",
              "Run it on every host of the plan: ./launch.sh --host NAME (--list-hosts shows the names); it reads the hosts'",
              "addresses from hosts.txt ('NAME ADDRESS' per line), starts that host's servers, waits for them and stops them together."]
    for i, d in enumerate(plan.deployments):
        header.append(f"deployment {i}: {d.workload} ({d.model}) on {d.rack}, {d.replicas} {d.role} "
                      f"replica(s), TP{d.tp} DPattn{d.dp_attn} EP{d.ep} PP{d.pp}, batch {d.batch_per_replica}")
    script, ports = LaunchScript(fmt, header, hosts, []), Ports()
    script.notes += engine_mismatch_notes(plan, fmt)
    for i, d in enumerate(plan.deployments):
        ENGINE_BUILDERS[fmt](plan, d, i, script, ports)
    if routers:
        _routers(plan, fmt, script, ports)
        _spreaders(plan, fmt, script, ports)
    return script


def export_plan(plan: Plan | dict, fmt: str, engine: str | None = None) -> str:
    """The plan in `fmt` (an ExportFormat value) as text; `engine` picks the engine of `lws`
    manifests (default: the plan's). A plan document (`planner.solve_record`) is read as a `Plan`."""
    plan = as_plan(plan)
    if fmt == "json":
        return json.dumps(placement_document(plan), indent=2, allow_nan=False) + "\n"
    if fmt == "lws":  # routers address each group's leader by its DNS name, at the template's ports
        engine = engine or str(plan.engine)
        script = build_launch(plan, engine, routers=False)
        script.endpoints = group_endpoints(plan, script, engine)
        _routers(plan, engine, script, Ports())
        vendors = {i: vendor_of(plan, d.accelerator) for i, d in enumerate(plan.deployments)}
        return manifests_text(plan, script, engine, vendors)
    return render_script(build_launch(plan, fmt))
