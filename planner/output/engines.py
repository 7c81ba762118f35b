"""The servers of a plan for each serving engine, as data for `planner/output/launch.py`.

Flag names and rules follow the engines' own argument parsers; `planner/output/engine_flags/` records
them with their version (`tools/record_engine_flags.py`), and the test suite checks every export of
every bundled problem against those tables.

Per server: it binds 0.0.0.0 on a port unique on its host; a replica over several hosts is started
by one command per host (vLLM data-parallel ranks with `--headless`, SGLang `--node-rank`), or by
`mpirun` from its first host (TensorRT-LLM). The checkpoint served is the one the problem or the
catalog names (planner/output/checkpoints.py).
"""

import json
from collections import OrderedDict
from dataclasses import dataclass

from planner.errors import InputIssue, PlannerInputError
from planner.hardware.catalog import load_hardware_catalog
from planner.modes import ServingRole
from planner.output.checkpoints import checkpoint, checkpoint_notes, model_source
from planner.output.launch import (
    HostRef,
    LaunchScript,
    RankRef,
    Server,
    Word,
    safe_file_name,
    word,
)
from planner.output.plan import Plan, PlanDeployment
from planner.output.plan_records import PlacedAccelerator

__all__ = ["ENGINE_BUILDERS", "ENGINE_VERSIONS", "Ports", "draft_tokens", "hosts_of", "replicas_of"]

# The engine releases whose parsers the flags were checked against (planner/output/engine_flags/).
ENGINE_VERSIONS = {"vllm": "vLLM 0.33.0", "sglang": "SGLang 0.5.23 (router: sglang-router 0.3.2)",
                   "trtllm": "TensorRT-LLM main after 1.3.0rc24 (serve.py, llm_args.py as of 2026-11)"}
API_PORT, RENDEZVOUS_PORT, SIDE_CHANNEL_PORT, BOOTSTRAP_PORT, ROUTER_PORT = 8000, 13345, 5600, 8998, 8192


@dataclass(frozen=True)
class Host:
    name: str  # "<rack-id>#<instance>/host<k>"
    local_indices: tuple[int, ...]  # accelerator indices on that host


class Ports:
    """Ports handed out per host, so that no two servers on one host collide."""

    def __init__(self) -> None:
        self.used: dict[tuple[str, int], int] = {}

    def take(self, host: str, base: int, width: int = 1) -> int:
        """The next free port from `base` on `host`, keeping `width` consecutive ports (vLLM's NIXL side
        channel listens on its base port + the data-parallel rank)."""
        n = self.used.get((host, base), 0)
        self.used[(host, base)] = n + width
        return base + n


# ---------------------------------------------------------------------------------------------
# reading the plan


def host_size(plan: Plan, rack_instance: str) -> int:
    info = plan.racks.get(rack_instance)
    if info is not None:
        return info.accelerators_per_host
    rack = load_hardware_catalog().racks.get(rack_instance.split("#")[0])
    return rack.host_size if rack else 1


def replicas_of(d: PlanDeployment) -> list[list[PlacedAccelerator]]:
    by_replica: OrderedDict[int, list[PlacedAccelerator]] = OrderedDict()
    for role in d.placement:
        by_replica.setdefault(role.replica, []).append(role)
    return list(by_replica.values())


def hosts_of(plan: Plan, roles: list[PlacedAccelerator]) -> list[Host]:
    hosts: OrderedDict[str, list[int]] = OrderedDict()
    for role in roles:
        rack, index = role.accelerator.rsplit("/", 1)
        size = host_size(plan, rack)
        hosts.setdefault(f"{rack}/host{int(index) // size}", []).append(int(index) % size)
    return [Host(name, tuple(idx)) for name, idx in hosts.items()]


def _max_len(d: PlanDeployment) -> int:
    """A request's whole sequence: its prompt and its output (the plan's lengths are its problem's; `check` holds them to it)."""
    return d.input_tokens + d.output_tokens


def _redundant(d: PlanDeployment) -> int:
    return d.expert_map.redundant_slots if d.expert_map else 0


def vendor_of(plan: Plan, accelerator_id: str) -> str:
    custom = {a["id"]: a for a in plan.problem_spec["cluster"].get("custom_accelerators", [])}
    if accelerator_id in custom:
        return str(custom[accelerator_id]["vendor"])
    accelerator = load_hardware_catalog().accelerators.get(accelerator_id)
    return accelerator.vendor if accelerator else "unknown"


def draft_tokens(plan: Plan, d: PlanDeployment, index: int, script: LaunchScript) -> int:
    """Draft tokens the deployment's servers verify per step (0: no speculative decoding), with a NOTE
    of the acceptance the plan assumed. A prefill deployment runs the draft with its decode side's
    number (engines need the same speculative settings on both sides of a disaggregated pair)."""
    spec, k = d.speculative, d.draft_tokens
    if spec is not None and d.role is ServingRole.PREFILL:
        k = max((o.draft_tokens for o in plan.deployments if o.workload == d.workload and o.role is ServingRole.DECODE), default=0)
    elif k:
        accepted = 1 if spec.accepted_tokens_per_step is None else spec.accepted_tokens_per_step
        script.notes.append(f"deployment {index}: speculative decoding with {k} MTP draft tokens per step; the plan assumes "
                            f"{float(accepted):.3g} tokens accepted per step "
                            f"({spec.acceptance_source or 'the workload acceptance'}); compare the engine's logged acceptance "
                            "length and re-plan with the workload's own acceptance if it differs")
    return k


def _visible(vendor: str, host: Host) -> Word:
    variable = "HIP_VISIBLE_DEVICES" if vendor == "AMD" else "CUDA_VISIBLE_DEVICES"
    return word(f"{variable}={','.join(map(str, host.local_indices))}")


def _label(d: PlanDeployment, index: int, roles: list[PlacedAccelerator], h: int = 0) -> str:
    return f"{d.workload}-{index}-r{roles[0].replica}" + (f"-h{h}" if h else "")


def _flags(*pairs) -> list[Word]:
    """Words of `--flag value` pairs (a None value drops the pair; True writes the bare flag)."""
    out: list[Word] = []
    for flag, value in pairs:
        if value is None or value is False:
            continue
        out.append(word(flag))
        if value is not True:
            out.append(value if isinstance(value, tuple) else word(value))
    return out


# ---------------------------------------------------------------------------------------------
# vLLM


def _vllm_refuses(plan: Plan, d: PlanDeployment, index: int) -> None:
    """Refuse a replica whose hosts hold some but not all pipeline stages of a data-parallel rank: vLLM
    starts every data-parallel rank with its whole TP x PP group on one host (data parallelism outermost,
    `--data-parallel-size-local` ranks per host), so the stages the plan spread over hosts would all run on
    each host and every MoE layer's expert collective would cross hosts. SGLang puts pipeline stages on
    consecutive nodes (entrypoints/engine.py `_calculate_rank_ranges`: node n runs PP ranks from
    n // (nnodes / pp_size)), as the plan does."""
    if d.pp == 1 or d.dp_attn == 1:
        return
    for roles in replicas_of(d):
        stages: dict[tuple[str, int], set[int]] = {}
        for role in roles:
            rack, slot = role.accelerator.rsplit("/", 1)
            stages.setdefault((f"{rack}/host{int(slot) // host_size(plan, rack)}", role.dp_rank), set()).add(role.stage)
        split = next(((host, rank) for (host, rank), held in stages.items() if len(held) < d.pp), None)
        if split:
            raise PlannerInputError(InputIssue(
                f"deployments[{index}]", f"vLLM runs each data-parallel rank's {d.pp} pipeline stages on one host, but the plan "
                f"puts only stage(s) {sorted(stages[split])} of rank {split[1]} on {split[0]}: every MoE layer's collective would "
                "cross hosts, slower than planned", "export --format sglang, which places pipeline stages host by host as planned"))


def _vllm(plan: Plan, d: PlanDeployment, index: int, script: LaunchScript, ports: Ports) -> None:
    _vllm_refuses(plan, d, index)
    ckpt, kv = checkpoint(plan, d), d.precisions.kv_cache
    tp, dp, ep, pp = d.tp, d.dp_attn, d.ep, d.pp
    role = d.role
    script.notes += checkpoint_notes(d, index, ckpt, "vllm")
    if ep not in (1, tp * dp):
        script.notes.append(f"vLLM sets EP = TP x DP with --enable-expert-parallel; deployment {index}'s EP {ep} becomes {tp * dp}")
    if d.expert_map:
        script.notes.append(f"deployment {index}: vLLM cannot load a given expert placement; EPLB rebalances at run time instead")
    common = _flags(("--tensor-parallel-size", tp), ("--pipeline-parallel-size", pp),
                    ("--max-num-seqs", max(1, d.batch_per_replica // dp)), ("--max-model-len", _max_len(d)),
                    ("--kv-cache-dtype", "fp8" if kv.startswith("fp8") else None),
                    # vLLM 0.33 deprecates `fp8` on a bf16 checkpoint for `fp8_per_tensor` (model_loader/weight_utils.py)
                    ("--quantization", "fp8_per_tensor" if ckpt.online_quantization == "fp8" else None),
                    ("--trust-remote-code", ckpt.trust_remote_code), ("--enable-expert-parallel", ep > 1),
                    ("--enable-eplb", _redundant(d) > 0),
                    ("--eplb-config", json.dumps({"num_redundant_experts": _redundant(d)}) if _redundant(d) else None))
    if k := draft_tokens(plan, d, index, script):  # `mtp` replaces the deprecated `deepseek_mtp` (vllm/config/speculative.py)
        common += _flags(("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})))
    if role != "aggregated":  # vLLM docs/features/nixl_connector_usage.md
        kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
        common += _flags(("--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})))
    for r, roles in enumerate(replicas_of(d)):
        hosts = hosts_of(plan, roles)
        head, port = hosts[0].name, ports.take(hosts[0].name, API_PORT)
        # Whole TP x PP groups on every host: data-parallel ranks per host (--headless after the first);
        # a group across hosts: one multi-node engine (--nnodes, --node-rank, --master-addr; mp backend).
        whole_groups = not any(len(h.local_indices) % (tp * pp) for h in hosts)
        rendezvous = ports.take(head, RENDEZVOUS_PORT) if len(hosts) > 1 else None
        script.endpoints.setdefault((d.workload, role), []).append((head, port, None))
        first_rank = 0
        for h, host in enumerate(hosts):
            local = len(host.local_indices) // (tp * pp)
            env = [_visible(vendor_of(plan, d.accelerator), host)]
            if role != "aggregated":
                env += [word("VLLM_NIXL_SIDE_CHANNEL_HOST=", HostRef(host.name)),
                        word(f"VLLM_NIXL_SIDE_CHANNEL_PORT={ports.take(host.name, SIDE_CHANNEL_PORT, width=max(1, local))}")]
            argv = [word("env"), *env, word("vllm"), word("serve"), word(ckpt.repo), *common]
            argv += _flags(("--host", "0.0.0.0"), ("--port", port if h == 0 else None), ("--data-parallel-size", dp if dp > 1 else None))
            if whole_groups:
                even = first_rank == h * local
                argv += _flags(("--data-parallel-size-local", local if dp > 1 else None),
                               ("--data-parallel-address", word(HostRef(head)) if rendezvous else None), ("--data-parallel-rpc-port", rendezvous),
                               ("--data-parallel-start-rank", word(RankRef(first_rank, local if even else None)) if h else None))
            else:
                argv += _flags(("--nnodes", len(hosts)), ("--node-rank", word(RankRef(h))), ("--master-addr", word(HostRef(head))),
                               ("--master-port", rendezvous))
            argv += _flags(("--headless", h > 0))
            script.servers.append(Server(host.name, _label(d, index, roles, h), argv, None if h else port, deployment=index, replica=r, host_rank=h))
            first_rank += local


# ---------------------------------------------------------------------------------------------
# SGLang


# config.json model types whose SGLang model class defines no `get_model_config_for_expert_location` (Llama 4:
# python/sglang/srt/models/llama4.py, found so for 0.5.23 in issue 24): SGLang's expert location is then a dummy of one
# layer and one expert (eplb/expert_location.py, ModelConfigForExpertLocation.from_model_config), so an initial
# expert map or redundant experts cannot be loaded.
SGLANG_NO_EXPERT_LOCATION = {"llama4"}


def _sglang_drops_expert_map(plan: Plan, d: PlanDeployment, index: int) -> str | None:
    """The NOTE for a model SGLang cannot give an expert placement to (None where it can)."""
    model_type = model_source(plan, d).model_type
    if model_type not in SGLANG_NO_EXPERT_LOCATION:
        return None
    emap = d.expert_map
    per_rank = emap.n_logical_experts // emap.n_ranks
    return (f"deployment {index}: SGLang's {model_type} model takes no expert placement (no get_model_config_for_expert_location), "
            f"so the plan's ({emap.n_ranks} ranks x {emap.slots_per_rank} slots, {_redundant(d)} redundant copies, max/mean "
            f"expert load {emap.imbalance:.4g} from {emap.profile}) is not applied: SGLang keeps one copy of each expert in "
            f"checkpoint order, expert e on expert-parallel rank e // {per_rank}, and the per-rank load follows the model's routing")


def _sglang(plan: Plan, d: PlanDeployment, index: int, script: LaunchScript, ports: Ports) -> None:
    ckpt, kv = checkpoint(plan, d), d.precisions.kv_cache
    tp, dp, ep, pp = d.tp, d.dp_attn, d.ep, d.pp
    role = d.role
    script.notes += checkpoint_notes(d, index, ckpt, "sglang")
    map_file = None
    if d.expert_map and (note := _sglang_drops_expert_map(plan, d, index)):
        script.notes.append(note)
    elif d.expert_map:
        map_file = safe_file_name(f"expert_map_{d.workload}_{index}.json")
        script.files[map_file] = json.dumps({"physical_to_logical_map": d.expert_map.physical_to_logical_map})
    # --attn-dp-size replaces --dp-size with --enable-dp-attention (deprecated in SGLang 0.5.23, server_args.py)
    common = _flags(("--tp-size", tp * dp), ("--pp-size", pp), ("--max-running-requests", d.batch_per_replica),
                    ("--context-length", _max_len(d)), ("--attn-dp-size", dp if dp > 1 else None),
                    ("--ep-size", ep if ep > 1 else None), ("--moe-a2a-backend", "deepep" if ep > 1 else None),
                    ("--kv-cache-dtype", "fp8_e4m3" if kv.startswith("fp8") else None),
                    ("--quantization", "fp8" if ckpt.online_quantization == "fp8" else None),
                    ("--load-format", "layered" if ckpt.online_quantization == "fp8" else None),  # quantize layer by layer, not after a bf16 load
                    ("--trust-remote-code", ckpt.trust_remote_code),
                    ("--init-expert-location", map_file), ("--ep-dispatch-algorithm", "static" if map_file else None),
                    ("--ep-num-redundant-experts", (_redundant(d) or None) if map_file else None),
                    ("--disaggregation-mode", role if role != "aggregated" else None),
                    ("--disaggregation-transfer-backend", "nixl" if role != "aggregated" else None))
    if k := draft_tokens(plan, d, index, script):  # the NextN layer drafts a chain: EAGLE (NEXTN is its alias), top-1
        common += _flags(("--speculative-algorithm", "EAGLE"), ("--speculative-num-steps", k), ("--speculative-eagle-topk", 1),
                         ("--speculative-num-draft-tokens", k + 1))
    for r, roles in enumerate(replicas_of(d)):
        hosts = hosts_of(plan, roles)
        head, port = hosts[0].name, ports.take(hosts[0].name, API_PORT)
        bootstrap = ports.take(head, BOOTSTRAP_PORT) if role == "prefill" else None
        rendezvous = ports.take(head, RENDEZVOUS_PORT) if len(hosts) > 1 else None
        script.endpoints.setdefault((d.workload, role), []).append((head, port, bootstrap))
        for h, host in enumerate(hosts):
            argv = [word("env"), _visible(vendor_of(plan, d.accelerator), host), word("python3"), word("-m"),
                    word("sglang.launch_server"), *_flags(("--model-path", ckpt.repo), ("--host", "0.0.0.0"), ("--port", port)), *common]
            argv += _flags(("--disaggregation-bootstrap-port", bootstrap), ("--nnodes", len(hosts) if rendezvous else None),
                           ("--node-rank", word(RankRef(h)) if rendezvous else None),
                           ("--dist-init-addr", word(HostRef(head), ":", rendezvous) if rendezvous else None))
            script.servers.append(Server(host.name, _label(d, index, roles, h), argv, None if h else port, deployment=index, replica=r, host_rank=h))


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM


def _trtllm_options(plan: Plan, d: PlanDeployment, index: int, script: LaunchScript) -> str:
    extra = [f"enable_attention_dp: {'true' if d.dp_attn > 1 else 'false'}"]
    role = d.role
    if role != "aggregated":  # TensorRT-LLM docs/source/features/disagg-serving.md
        extra += (["disable_overlap_scheduler: true"] if role == "prefill" else [])
        extra += ["cache_transceiver_config:", "  backend: UCX", f"  max_tokens_in_buffer: {_max_len(d)}"]
    if d.precisions.kv_cache.startswith("fp8"):
        extra += ["kv_cache_config:", "  dtype: fp8"]
    if k := draft_tokens(plan, d, index, script):  # MTPDecodingConfig; max_draft_len replaces num_nextn_predict_layers
        extra += ["speculative_config:", "  decoding_type: MTP", f"  max_draft_len: {k}"]
    if d.expert_map:
        balancer = safe_file_name(f"moe_load_balancer_{d.workload}_{index}.yaml")
        emap = d.expert_map
        body = [f"num_slots: {emap.n_ranks * emap.slots_per_rank}", "layer_updates_per_iter: 0", "initial_global_assignments:"]
        body += [f"  {layer}: {json.dumps(emap.physical_to_logical_map[layer])}" for layer in emap.moe_layers]
        script.files[balancer] = "\n".join(body)
        # the default MoE backend (CUTLASS) takes a load balancer; WIDEEP, which older releases required, was removed in 2026
        extra += ["moe_config:", f"  load_balancer: {balancer}"]
    name = safe_file_name(f"extra_llm_api_options_{d.workload}_{index}.yaml")
    script.files[name] = "\n".join(extra)
    return name


def _trtllm(plan: Plan, d: PlanDeployment, index: int, script: LaunchScript, ports: Ports) -> None:
    ckpt = checkpoint(plan, d)
    script.notes += checkpoint_notes(d, index, ckpt, "trtllm")
    tp, dp, ep, pp = d.tp, d.dp_attn, d.ep, d.pp
    if ckpt.online_quantization:
        script.notes.append(f"deployment {index}: TensorRT-LLM does not quantize at load time and no {ckpt.online_quantization} checkpoint "
                            f"of {d.model} is named (catalog or problem); quantize {ckpt.repo} with TensorRT Model Optimizer and serve that")
    if dp > 1 and tp > 1:
        script.notes.append(f"deployment {index}: TensorRT-LLM attention data parallelism runs attention unsharded; TP {tp} becomes 1")
    options = _trtllm_options(plan, d, index, script)
    for r, roles in enumerate(replicas_of(d)):
        hosts = hosts_of(plan, roles)
        head, port = hosts[0].name, ports.take(hosts[0].name, API_PORT)
        script.endpoints.setdefault((d.workload, d.role), []).append((head, port, None))
        serve = [word("trtllm-serve"), word(ckpt.repo)]
        serve += _flags(("--host", "0.0.0.0"), ("--port", port), ("--backend", "pytorch"), ("--tp_size", tp * dp), ("--pp_size", pp),
                        ("--ep_size", ep), ("--max_batch_size", max(1, d.batch_per_replica // dp)),
                        ("--max_seq_len", _max_len(d)), ("--extra_llm_api_options", options),
                        ("--trust_remote_code", ckpt.trust_remote_code))
        if len(hosts) > 1:  # one MPI job from the first host reaches the others
            parts: list = []
            for h, host in enumerate(hosts):
                parts += ([","] if h else []) + [HostRef(host.name), f":{len(host.local_indices)}"]
            argv = [word("mpirun"), word("-n"), word(len(roles)), word("--host"), word(*parts), word("trtllm-llmapi-launch"), *serve]
        else:
            argv = [word("env"), _visible("NVIDIA", hosts[0]), *serve]
        script.servers.append(Server(head, _label(d, index, roles), argv, port, deployment=index, replica=r))


ENGINE_BUILDERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}
