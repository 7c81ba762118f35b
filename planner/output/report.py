"""Rendering of estimates: a JSON-ready record (SI units) and rich terminal tables."""

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.modes import ServingRole, StepModel
from planner.physics.estimate import Estimate
from planner.physics.first_token import TTFT_QUANTILE
from planner.physics.roofline import StepTime
from planner.units import format_bytes, format_rate, format_seconds, format_usd

__all__ = ["estimate_record", "render_estimate", "step_record"]


def step_record(step: StepTime) -> dict[str, float | str]:
    return {
        "compute": step.compute_s,
        "weights": step.weights_s,
        "kv": step.kv_s,
        "comm": step.comm_s,
        "overhead": step.overhead_s,
        "total": step.total_s,
        "total_range": list(step.range_s),
    }


def _layout_record(e: Estimate) -> dict:
    inp, prec = e.inputs, e.inputs.precisions
    return {
        "model": inp.arch.id,
        "rack": inp.rack.id,
        "accelerator": inp.rack.accelerator.id,
        "engine": str(inp.engine),
        "step_model": str(e.step_model),
        "kernel_source": e.kernel_source or None,
        "layout": {"tp": inp.layout.tp, "ep": inp.layout.ep, "pp": inp.layout.pp, "dp_attn": inp.layout.dp_attn,
                   "expert_tp": inp.layout.expert_tp},
        "accelerators": e.n_accelerators,
        "batch_per_replica": inp.batch_per_replica,
        "input_tokens": inp.input_tokens,
        "output_tokens": inp.output_tokens,
        "precisions": {"weights": str(prec.weights), "expert_weights": str(prec.expert_weights or prec.weights),
                       "kv_cache": str(prec.kv_cache), "activations": str(prec.activations), "compute": str(prec.compute)},
        "role": str(inp.role),
        "speculative": _speculative_record(e),
    }


def _speculative_record(e: Estimate) -> dict | None:
    """Speculative decoding: draft tokens per step, acceptance, tokens a step emits and the step itself."""
    spec = e.inputs.speculative
    if spec is None:
        return None
    return {"method": spec.method, "draft_tokens": spec.draft_tokens,
            "acceptance_rates": list(spec.acceptance_rates[:spec.draft_tokens]) if spec.accepted_tokens is None else None,
            "accepted_tokens_per_step": spec.tokens_per_step, "acceptance_source": spec.source or None,
            "step_time_s": e.stage_time_s * e.inputs.layout.pp}


def _figures_record(e: Estimate) -> dict:
    inp = e.inputs
    return {
        "tpot_s": e.tpot_s,
        "tpot_s_range": list(e.tpot_range_s),
        "mean_step_per_token_s": e.mean_step_per_token_s,
        "ttft_s": e.ttft_s,
        "ttft_s_range": list(e.ttft_range_s),
        "ttft_p90_s": e.ttft_p90_s,
        "prefill_latency_s": e.prefill_latency_s,
        "queue_wait_s": e.queue_wait_s,
        "cache_hit_latency_s": e.cache_hit_latency_s,
        "output_tokens_per_s_per_replica": e.sustained_output_tokens_per_s,
        "output_tokens_per_s_per_accelerator": e.output_tokens_per_s_per_accelerator,
        "output_tokens_per_s_per_accelerator_range": list(e.output_tokens_per_s_per_accelerator_range),
        "input_tokens_per_s_per_replica": e.sustained_input_tokens_per_s,
        "input_tokens_per_s_per_replica_range": list(e.input_tokens_per_s_range),
        "decode_only_tokens_per_s_per_replica": e.decode_tokens_per_s,
        "decode_only_tokens_per_s_per_replica_range": list(e.decode_tokens_per_s_range),
        "prefill_only_tokens_per_s_per_replica": e.prefill_tokens_per_s,
        "prefill_only_tokens_per_s_per_replica_range": list(e.prefill_tokens_per_s_range),
        "prefill_tokens_per_step": e.prefill_riders_per_step,
        "prompt_cache": None if inp.prefix_cache is None else {
            "tier": inp.prefix_cache.tier.id, "hit_rate": inp.prefix_cache.hit_rate, "prefix_tokens": inp.prefix_cache.prefix_tokens,
            "retention_s": inp.prefix_cache.retention_s, "bytes_per_accelerator": e.prompt_cache_bytes_per_accelerator,
            "storage_usd_per_hour": e.storage_usd_per_hour},
        "requests_per_s_per_replica": e.requests_per_s,
        "usd_per_hour_per_replica": e.usd_per_hour,
        "usd_per_million_output_tokens": e.usd_per_million_output_tokens_all_in,
        "usd_per_million_output_tokens_range": list(e.usd_per_million_output_tokens_range),
        "usd_per_million_output_tokens_decode_only": e.usd_per_million_decode_tokens,
        "usd_per_million_input_tokens": e.usd_per_million_prefill_tokens,
        "usd_per_request": e.usd_per_request,
    }


def _steps_record(e: Estimate) -> dict:
    mem = e.memory
    return {
        "step_time_s": step_record(e.serving_step),
        "decode_only_step_time_s": step_record(e.decode_step),
        "dominant_term": e.serving_step.dominant_term,
        "bound": e.serving_step.bound,
        "prefill_chunk_step_time_s": step_record(e.prefill_chunk_step),
        "roofline": None if e.roofline is None else {
            "tpot_s": e.roofline.tpot_s, "fraction_reached": e.roofline.fraction,
            "gap_s": {name: seconds for name, seconds in e.roofline.gap_terms}},
        "memory_bytes_per_accelerator": {"weights": mem.weights_bytes, "kv": mem.kv_bytes, "activations": mem.activations_bytes,
                                         "capacity": mem.capacity_bytes, "free": mem.free_bytes},
        "hbm_fill_fraction": mem.fill_fraction,
        "fits_hbm": mem.fits,
        "expert_touch_fraction": e.expert_touch_fraction,
    }


def _links_record(e: Estimate) -> dict:
    finite = lambda x: x if x is not None and x != float("inf") else None  # JSON has no Infinity: null = not limited
    return {
        "tp_link_kind": e.links.tp.link_kind,
        "tp_injection_bytes_per_s": finite(e.links.tp.injection_bytes_per_s),
        "stage_link_kind": e.links.stage.link_kind,
        "stage_injection_bytes_per_s": finite(e.links.stage.injection_bytes_per_s),
        "stage_bisection_bytes_per_s": finite(e.links.stage.bisection_bytes_per_s),
        "pp_bandwidth_bytes_per_s": finite(e.links.pp_bandwidth_bytes_per_s) if e.inputs.layout.pp > 1 else None,
        "scale_up_domains": e.links.n_scale_up_domains,
    }


def estimate_record(e: Estimate) -> dict:
    """Every figure of an estimate, SI units, keys named with their unit; each headline figure has a
    `<field>_range` [p10, p90] beside it."""
    return {**_layout_record(e), **_figures_record(e), **_steps_record(e), "links": _links_record(e), "assumptions": list(e.assumptions)}


_TERM_LABELS = (("compute", "compute"), ("weights", "weights fetch"), ("kv", "KV fetch"), ("comm", "communication"),
                ("overhead", "kernel floors + elementwise"))


def _step_table(title: str, step: StepTime) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in (("term", "left"), ("time", "right"), ("share", "right"), ("", "left")):
        table.add_column(name, justify=justify)
    total = step.total_s
    values = {"compute": step.compute_s, "weights": step.weights_s, "kv": step.kv_s, "comm": step.comm_s, "overhead": step.overhead_s}
    for key, label in _TERM_LABELS:
        if key == "overhead" and step.model is StepModel.ROOFLINE:
            continue
        table.add_row(label, format_seconds(values[key]), f"{values[key] / total:.0%}" if total else "-",
                      "<- dominant" if key == step.dominant_term else "")
    if step.model is StepModel.ROOFLINE:
        rule = "max(compute, weights+KV) + comm" if step.overlap == "serial" else "max(compute, weights+KV, comm)"
    else:
        rule = "sum of kernel times + comm" if step.overlap == "serial" else "max(sum of kernel times, comm)"
    low, high = step.range_s
    span = f"; range {format_seconds(low)}-{format_seconds(high)}" if high > low else ""
    other = "memory" if step.bound == "compute" else "compute"
    side = f"{step.bound}-bound" if step.dominant_term in ("compute", "weights", "kv") else f"{step.bound} exceeds {other}"
    table.add_row("[bold]step[/bold]", f"[bold]{format_seconds(total)}[/bold]", "", f"{side}; {rule} = {format_seconds(total)}{span}")
    return table


def _render_steps(e: Estimate, console: Console) -> None:
    inp = e.inputs
    if inp.role is ServingRole.AGGREGATED:
        console.print(_step_table(f"Mean decode step with the prompts' prefill ({e.prefill_riders_per_step * inp.layout.pp:,.0f} prompt "
                                  "tokens per step on average): time per output token, all pipeline stages", e.serving_step))
        console.print(f"A decode-only step would take {format_seconds(e.decode_step.total_s)} "
                      f"({e.decode_step.dominant_term} dominant); the prompts add "
                      f"{format_seconds(e.serving_step.total_s - e.decode_step.total_s)} to every token on average (prefill interference); "
                      f"a user, whose own prompt is not between its tokens, waits {format_seconds(e.tpot_s)} per token.")
    elif inp.role is ServingRole.PREFILL:
        console.print(_step_table("Prefill replica: one prefill pass through the slowest stage (pass size under Assumptions)",
                                  e.prefill_chunk_step))
        console.print(f"Passes back to back at this batch: {format_rate(e.sustained_input_tokens_per_s)} prompt tokens per replica "
                      f"(full passes: {format_rate(e.prefill_tokens_per_s)}); the KV cache of each prompt then leaves for a decode "
                      "replica (`planner solve` costs that hand-off and the decode join).")
    else:
        console.print(_step_table("Decode replica: pure decode step, time per output token (all pipeline stages)", e.decode_step))
    spec = inp.speculative
    if spec is not None and spec.draft_tokens and inp.role is not ServingRole.PREFILL:
        console.print(f"Speculative decoding (MTP, {spec.draft_tokens} draft token{'s' if spec.draft_tokens > 1 else ''}): a step of "
                      f"{format_seconds(e.stage_time_s * inp.layout.pp)} verifies {spec.queries} tokens per sequence and emits "
                      f"{spec.tokens_per_step:.3g} on average, so the terms above are per output token (step / {spec.tokens_per_step:.3g}).")
    if e.roofline is not None:
        basis = f"derived rates, {inp.engine}'s kernels on {e.kernel_source.split(' (')[0].removeprefix('derived from ')}" \
            if e.kernel_source.startswith("derived") else f"{inp.engine}"
        console.print(f"Calibrated ({basis}): {e.roofline.sentence()} (the ideal roofline's TPOT is {format_seconds(e.roofline.tpot_s)}).")


def _span(low: float, high: float, fmt) -> str:
    return f"{fmt(low)} - {fmt(high)}" if high > low else ""


def _render_latency(e: Estimate, console: Console) -> None:
    inp = e.inputs
    latency = Table(title="Latency", title_justify="left")
    for name, justify in (("figure", "left"), ("value", "right"), ("range (p10-p90)", "right")):
        latency.add_column(name, justify=justify)
    if inp.role is not ServingRole.PREFILL:
        latency.add_row("TPOT (time per output token)", format_seconds(e.tpot_s), _span(*e.tpot_range_s, format_seconds))
    latency.add_row("TTFT (time to first token), mean" if inp.role is ServingRole.AGGREGATED else "TTFT in this replica, mean",
                    format_seconds(e.ttft_s), _span(*e.ttft_range_s, format_seconds))
    queue_label = {ServingRole.AGGREGATED: "  waiting for the step in progress", ServingRole.PREFILL: "  waiting for the pass in progress",
                   ServingRole.DECODE: "  waiting for the step in progress"}[inp.role]
    latency.add_row(queue_label, format_seconds(e.queue_wait_s), "")
    service_label = {ServingRole.AGGREGATED: "  the steps that carry the prompt", ServingRole.PREFILL: "  the prompt's pass(es)",
                     ServingRole.DECODE: "  its first decode step"}[inp.role]
    latency.add_row(service_label + (" (a cache miss)" if e.cache_hit_latency_s else ""), format_seconds(e.prefill_latency_s), "")
    if e.cache_hit_latency_s:
        latency.add_row("  a cache hit: reload + rest of the prompt", format_seconds(e.cache_hit_latency_s), "")
    latency.add_row(f"TTFT p{TTFT_QUANTILE * 100:.0f} (what TTFT limits hold at)", format_seconds(e.ttft_p90_s), "")
    console.print(latency)


def _render_memory(e: Estimate, console: Console) -> None:
    mem, accel = e.memory, e.inputs.rack.accelerator
    memory = Table(title=f"HBM per accelerator ({accel.id}, {format_bytes(mem.capacity_bytes)})", title_justify="left")
    for name, justify in (("use", "left"), ("bytes", "right"), ("share", "right"), ("", "left")):
        memory.add_column(name, justify=justify)
    for name, value in (("weights", mem.weights_bytes), ("KV cache", mem.kv_bytes), ("activations + reserves + KV margin", mem.activations_bytes)):
        memory.add_row(name, format_bytes(value), f"{value / mem.capacity_bytes:.0%}")
    status = "[green]fits[/green]" if mem.fits else "[red bold]DOES NOT FIT[/red bold]"
    memory.add_row("[bold]total[/bold]", f"[bold]{format_bytes(mem.used_bytes)}[/bold]", f"[bold]{mem.fill_fraction:.0%}[/bold]", status)
    console.print(memory)


def _render_money(e: Estimate, console: Console) -> None:
    money = Table(title="Throughput and cost", title_justify="left")
    for name, justify in (("figure", "left"), ("value", "right"), ("range (p10-p90)", "right")):
        money.add_column(name, justify=justify)
    money.add_row("output tokens/s per replica (sustained)", format_rate(e.sustained_output_tokens_per_s), "")
    money.add_row("output tokens/s per accelerator", format_rate(e.output_tokens_per_s_per_accelerator),
                  _span(*e.output_tokens_per_s_per_accelerator_range, format_rate))
    money.add_row("input tokens/s per replica", format_rate(e.sustained_input_tokens_per_s), "")
    money.add_row("replica cost", f"{format_usd(e.usd_per_hour)}/h", "")
    money.add_row("USD per million output tokens, all in", format_usd(e.usd_per_million_output_tokens_all_in),
                  _span(*e.usd_per_million_output_tokens_range, format_usd))
    money.add_row("  a decode token alone", format_usd(e.usd_per_million_decode_tokens), "")
    money.add_row("  a prefill token alone", format_usd(e.usd_per_million_prefill_tokens), "")
    money.add_row("USD per request", format_usd(e.usd_per_request), "")
    console.print(money)


def render_estimate(e: Estimate, console: Console) -> None:
    inp, mem = e.inputs, e.memory
    console.print(
        f"[bold]{escape(inp.arch.name)}[/bold] on [bold]{escape(inp.rack.name)}[/bold]: {inp.layout.describe()}, "
        f"batch {inp.batch_per_replica}, {inp.input_tokens} in / {inp.output_tokens} out tokens, "
        f"weights {inp.precisions.weights}, KV {inp.precisions.kv_cache}, compute {inp.precisions.compute}, engine {inp.engine}"
    )
    _render_steps(e, console)
    _render_latency(e, console)
    _render_memory(e, console)
    _render_money(e, console)
    if not mem.fits:
        console.print(
            f"[red]The replica needs {format_bytes(mem.used_bytes)} per accelerator but {inp.rack.accelerator.id} has "
            f"{format_bytes(mem.capacity_bytes)}.[/red] Shard the weights further (raise tp/ep/pp), lower the batch, "
            "or use narrower weight/KV formats."
        )
    console.print("[bold]Assumptions[/bold]")
    for note in e.assumptions:
        console.print(f"  - {escape(note)}")
