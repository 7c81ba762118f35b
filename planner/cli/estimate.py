"""`planner estimate`: one fixed deployment evaluated and its roofline breakdown shown."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from planner.cli.common import (
    EXIT_INFEASIBLE,
    EXIT_OK,
    resolve_problem_path,
    write_json,
)
from planner.errors import InputIssue, PlannerInputError, unknown_name_issue
from planner.hardware.catalog import HardwareCatalog, load_hardware_catalog
from planner.hardware.user_catalog import with_user_catalog
from planner.model.catalog import load_model_catalog
from planner.modes import Engine, OverlapPolicy, ServingRole, StepModel
from planner.output.report import estimate_record, render_estimate
from planner.physics.deployment import Layout
from planner.physics.estimate import estimate
from planner.physics.inputs import (
    DEFAULT_PREFILL_CHUNK_TOKENS,
    DeploymentInputs,
    ExpertFigures,
    ServingOptions,
    deployment_inputs,
)
from planner.physics.kv_cache import cache_use, tiers_for
from planner.physics.prefill import packed_prompts
from planner.physics.speculation import Speculation
from planner.problem.resolve import (
    SpeculativeRequest,
    resolve_precisions,
    resolve_problem,
    resolve_speculative,
)
from planner.problem.schema import PrecisionSpec, SpeculativeSpec, load_problem

__all__ = ["estimate_command", "estimate_inputs"]


_FLAG_OF_FIELD = {"layout.tp": "--tp", "layout.ep": "--ep", "layout.pp": "--pp", "layout.dp_attn": "--dp-attn", "layout.batch": "--batch"}


@dataclass
class _Defaults:
    """What a problem file (or nothing) gives `estimate` before the flags override it."""

    hardware: HardwareCatalog
    arch: object = None
    spec: PrecisionSpec = field(default_factory=PrecisionSpec)
    rack_id: str | None = None
    isl: int = 2048
    osl: int = 256
    cache_request: object = None
    engine: Engine = Engine.TRTLLM
    speculative: SpeculativeRequest | None = None


def _defaults(args: argparse.Namespace) -> _Defaults:
    if not args.problem:
        return _Defaults(load_hardware_catalog())
    path = resolve_problem_path(args.problem)
    resolved = resolve_problem(load_problem(path), base_dir=path.parent, source=str(path))
    names = [w.name for w in resolved.workloads]
    if args.workload and args.workload not in names:
        raise PlannerInputError(unknown_name_issue("--workload", "workload", args.workload, names))
    workload = resolved.workloads[names.index(args.workload)] if args.workload in names else resolved.workloads[0]
    model = resolved.models[workload.model_key]
    return _Defaults(resolved.hardware, model.arch, model.precisions, resolved.rack_counts[0][0].id,
                     workload.input_tokens, workload.output_tokens, workload.prefix_cache, resolved.serving.engine, workload.speculative)


_FLAG_OF_SPECULATIVE_FIELD = {"acceptance_rates": "--acceptance", "acceptance_length": "--acceptance-length",
                              "draft_tokens": "--speculative-tokens", "remove speculative": "drop --speculative-tokens"}


def _flag_words(text: str) -> str:
    """A problem-file message in the words of the estimate flags."""
    for name, flag in _FLAG_OF_SPECULATIVE_FIELD.items():
        text = text.replace(name, flag)
    return text


def _speculation(args: argparse.Namespace, arch, request: SpeculativeRequest | None) -> Speculation | None:
    """The replica's speculative decoding from the flags, else the problem workload's fixed number of
    draft tokens (its `auto` needs --speculative-tokens here)."""
    role = ServingRole(args.role)
    if args.speculative_tokens is None:
        if args.acceptance is not None or args.acceptance_length is not None:
            raise PlannerInputError(InputIssue("--acceptance", "acceptance without draft tokens", "add --speculative-tokens K"))
        return request.speculation(request.draft_tokens or 0, role) if request is not None and request.draft_tokens else None
    if args.speculative_tokens == 0:
        return None
    try:
        spec = SpeculativeSpec(draft_tokens=args.speculative_tokens, acceptance_rates=args.acceptance, acceptance_length=args.acceptance_length)
    except ValidationError as exc:
        problem = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        what, _, fix = problem.partition("\n    fix: ")
        raise PlannerInputError(InputIssue("--speculative-tokens", _flag_words(what), _flag_words(fix) or "check the acceptance flags")) from None
    try:
        resolved = resolve_speculative(spec, arch, "--speculative-tokens")
    except PlannerInputError as exc:
        raise PlannerInputError([InputIssue(_FLAG_OF_SPECULATIVE_FIELD.get(i.field.rsplit(".", 1)[-1], "--speculative-tokens"), i.problem,
                                            _flag_words(i.fix)) for i in exc.issues]) from None
    return resolved.speculation(args.speculative_tokens, role)


def _prefill_batch(layout: Layout, input_tokens: int, chunk_tokens: int | None) -> tuple[int, tuple[str]]:
    """A prefill replica's batch when --batch is not given: the prompts one pass holds, as many as
    the engine's token budget packs on every attention rank and pipeline micro-batch (at least one),
    the largest prefill batch the solver considers; with the note that says so."""
    budget = chunk_tokens or DEFAULT_PREFILL_CHUNK_TOKENS
    per_rank = max(packed_prompts(input_tokens, budget), 1)
    batch = per_rank * layout.pp * layout.dp_attn
    return batch, ((f"batch {batch} (no --batch): a prefill pass holds {per_rank} prompt(s) of {input_tokens} tokens in the "
                    f"{budget}-token budget on each of {layout.dp_attn} attention rank(s) x {layout.pp} stage(s); "
                    "pass --batch to choose another"),)


def estimate_inputs(args: argparse.Namespace) -> DeploymentInputs:
    d = _defaults(args)
    if getattr(args, "kernel_catalog", None):
        d.hardware = with_user_catalog(d.hardware, Path(args.kernel_catalog))
    hardware, arch, spec, rack_id, isl, osl, cache_request = d.hardware, d.arch, d.spec, d.rack_id, d.isl, d.osl, d.cache_request
    models = load_model_catalog()
    issues = []
    if args.model:
        if args.model not in models:
            issues.append(unknown_name_issue("--model", "model", args.model, models))
        else:
            arch = models[args.model]
    if args.rack:
        if args.rack not in hardware.racks:
            issues.append(unknown_name_issue("--rack", "rack", args.rack, hardware.racks))
        rack_id = args.rack
    if arch is None and not args.model:
        issues.append(InputIssue("--model", "no model given", "pass --model NAME (see `planner catalog`) or a problem file"))
    if rack_id is None and not args.rack:
        issues.append(InputIssue("--rack", "no rack given", "pass --rack NAME (see `planner catalog`) or a problem file"))
    if args.batch is None and args.role != ServingRole.PREFILL:
        issues.append(InputIssue("--batch", "no decode batch given", "pass --batch N (sequences in flight per replica)"))
    tier_id = args.cache_tier or (cache_request.tier if cache_request is not None and not cache_request.any_tier else None)
    if args.cache_tier and cache_request is None:
        issues.append(InputIssue("--cache-tier", "no prompt cache to place: the workload declares no prefix_cache",
                                 "pass a problem whose workload has prefix_cache, or drop --cache-tier"))
    if issues:
        raise PlannerInputError(issues)
    rack = hardware.racks[rack_id]
    cache = None
    if tier_id is not None and cache_request is not None:
        tiers = [t.id for t in tiers_for(rack.accelerator)]
        if tier_id not in tiers:
            raise PlannerInputError(unknown_name_issue("--cache-tier", f"KV tier on {rack.accelerator.id}", tier_id, tiers))
        cache = cache_use(cache_request, tier_id, rack.accelerator)
    if args.price is not None:
        hardware = hardware.with_overrides(price_usd_per_hour={rack.accelerator.id: args.price})
        rack = hardware.racks[rack_id]
    layout = Layout(tp=args.tp, ep=args.ep, pp=args.pp, dp_attn=args.dp_attn) if args.dp_attn else Layout.with_default_dp_attn(args.tp, args.ep, args.pp)
    batch, batch_note = (args.batch, ()) if args.batch is not None else _prefill_batch(layout, args.isl or isl, args.prefill_chunk)
    flags = {"weights": args.weights_precision, "kv_cache": args.kv_precision,
             "activations": args.activations_precision, "compute": args.compute_precision}
    spec = PrecisionSpec(**(spec.model_dump() | {k: v for k, v in flags.items() if v is not None}))
    precisions, notes = resolve_precisions(spec, arch, rack.accelerator, field_name="--compute-precision")
    serving = ServingOptions(OverlapPolicy(args.overlap), args.prefill_chunk or DEFAULT_PREFILL_CHUNK_TOKENS, Engine(args.engine or d.engine),
                             StepModel(args.step_model))
    experts = ExpertFigures(args.expert_imbalance, redundant_total=args.redundant_experts,
                            routing=args.expert_routing or ("balanced" if args.expert_imbalance > 1.0 else None))
    speculative = _speculation(args, arch, d.speculative if arch is d.arch else None)
    try:
        return deployment_inputs(arch, rack, layout, batch, (args.isl or isl, args.osl or osl), precisions, hardware.overheads, serving,
                                 notes=(*notes, *batch_note), role=ServingRole(args.role), prefix_cache=cache, experts=experts, speculative=speculative)
    except PlannerInputError as exc:
        raise PlannerInputError([_flag_issue(i) for i in exc.issues]) from None


def _flag_issue(issue: InputIssue) -> InputIssue:
    """A deployment issue in the words of the estimate flags."""
    if issue.field in _FLAG_OF_FIELD:
        return InputIssue(_FLAG_OF_FIELD[issue.field], issue.problem, issue.fix.replace("dp_attn", "--dp-attn"))
    return InputIssue("--tp" if issue.field.endswith(".tp") else "--ep", issue.problem, issue.fix)


def estimate_command(args: argparse.Namespace, console: Console) -> int:
    inputs = estimate_inputs(args)
    result = estimate(inputs)
    render_estimate(result, console)
    if args.json:
        write_json(args.json, estimate_record(result), console)
    return EXIT_OK if result.fits else EXIT_INFEASIBLE
