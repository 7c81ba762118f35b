"""The argument parser: light imports only (leaf modules), so `planner --help` starts fast; each
command names its handler as 'module:function', imported only when the command runs."""

import argparse
import math

from planner import __version__
from planner.limits import (
    MAX_BATCH_PER_REPLICA,
    MAX_CURVE_POINTS,
    MAX_DRAFT_TOKENS,
    MAX_FRONTIER_POINTS,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_PARALLEL_DEGREE,
    MAX_PREFILL_CHUNK_TOKENS,
    MAX_PRICE_USD_PER_ACCELERATOR_HOUR,
    MAX_RACKS_PER_TYPE,
    MAX_REDUNDANT_EXPERTS,
    MAX_SEED,
    MAX_SWEEP_PROBLEMS,
    MAX_TIME_LIMIT_S,
)
from planner.modes import (
    EXPERT_ROUTINGS,
    Confidence,
    Engine,
    ExportFormat,
    OverlapPolicy,
    ServingRole,
    StepModel,
)
from planner.precision import FlopsFormat, Precision
from planner.units import SECONDS_PER_HOUR

__all__ = ["acceptance_rates", "bounded", "build_parser", "positive", "rl_factor"]


def bounded(kind: type, low: float, high: float, *, exclusive_low: bool = False) -> object:
    """argparse type: a finite number of `kind` within [low, high] (or (low, high]); the same rules as
    the problem file's fields, so `--isl 0` is an error rather than the default."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < low or (exclusive_low and value == low) or value > high:
            bound = f"greater than {low:g}" if exclusive_low else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"must be {bound} and at most {high:g}, got {text}")
        return value

    return parse


def positive(kind: type, high: float = 1e15) -> object:
    """argparse type: a finite number of `kind` greater than zero and at most `high`."""
    return bounded(kind, 0, high, exclusive_low=True)


def acceptance_rates(text: str) -> list[float]:
    """argparse type: comma-separated acceptance rates, each in (0, 1], at most MAX_DRAFT_TOKENS."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    share = bounded(float, 0.0, 1.0, exclusive_low=True)
    if not parts or len(parts) > MAX_DRAFT_TOKENS:
        raise argparse.ArgumentTypeError(f"give 1 to {MAX_DRAFT_TOKENS} comma-separated rates, e.g. 0.9,0.7,0.4, got {text!r}")
    return [share(part) for part in parts]


def rl_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 2.0 <= value <= 6.0:
        raise argparse.ArgumentTypeError(f"RL costs 2 (rollouts only) to 6 (backward on every rollout) FLOPs per parameter and token, got {text}")
    return value


def _add_probe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="measure the step model's kernels on this machine and write kernel tables for calibrate",
                       description="Time dense and expert GEMMs, decode and prefill attention (GQA and MLA), elementwise work, HBM "
                                   "copies and (with several GPUs) collectives at the shapes of the models named, within a time budget, "
                                   "and write them as kernel tables with a record of the machine (probe.yaml). "
                                   "Needs PyTorch: pip install 'llm-deployment-planner[probe]'.")
    p.add_argument("models", nargs="+", help="catalog model ids or config.json files whose shapes are measured")
    p.add_argument("-o", "--out", required=True, help="directory for probe.yaml and the tables")
    p.add_argument("--budget-s", type=positive(float, SECONDS_PER_HOUR), default=180.0, help="time budget in seconds; trims shapes, never kernel classes (default 180)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, a few seconds: checks the whole path, measures nothing useful")
    p.add_argument("--ranks", type=bounded(int, 1, 64), help="processes for the collectives (default: every GPU; 1 on a CPU)")
    p.add_argument("--warmup", type=bounded(int, 0, 100), default=3, help="untimed calls before each shape (default 3)")
    p.add_argument("--iterations", type=bounded(int, 1, 1000), default=10, help="timed calls per shape, their median kept (default 10)")
    p.set_defaults(handler="planner.cli.probe:probe_command")


def _add_estimate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="evaluate one fixed deployment and show its roofline breakdown",
                       description="Evaluate one replica: step-time terms, TPOT, TTFT, HBM use and cost. "
                                   "Exit code 3 when the deployment does not fit in HBM.")
    p.add_argument("problem", nargs="?", help="optional problem file (or bundled problem name) giving model, rack and workload")
    p.add_argument("--workload", help="workload of the problem to use (default: the first)")
    p.add_argument("--model", help="model id, e.g. llama-3.1-70b")
    p.add_argument("--rack", help="rack / scale-up unit id, e.g. hgx-h100")
    p.add_argument("--kernel-catalog", metavar="DIR", help="a user catalog (`planner calibrate <probe dir> --out DIR`): its probed "
                   "accelerators, racks and kernel curves added to the catalog")
    p.add_argument("--tp", type=bounded(int, 1, MAX_PARALLEL_DEGREE), default=1, help="tensor-parallel degree of attention and dense weights")
    p.add_argument("--ep", type=bounded(int, 1, MAX_PARALLEL_DEGREE), default=1, help="expert-parallel degree")
    p.add_argument("--pp", type=bounded(int, 1, MAX_PARALLEL_DEGREE), default=1, help="pipeline stages")
    p.add_argument("--dp-attn", type=bounded(int, 1, MAX_PARALLEL_DEGREE), default=None, help="attention data-parallel ranks per stage (default: ep/tp when ep > tp)")
    p.add_argument("--batch", type=bounded(int, 1, MAX_BATCH_PER_REPLICA), help="sequences in flight per replica (all micro-batches)")
    p.add_argument("--redundant-experts", type=bounded(int, 0, MAX_REDUNDANT_EXPERTS), default=0,
                   help="extra expert slots over the expert-parallel group (hot-expert copies), e.g. 32 for 256 experts on EP72")
    p.add_argument("--expert-imbalance", type=bounded(float, 1.0, 1024.0), default=1.0,
                   help="the hottest expert-parallel rank's load over the mean (1.0: even; `planner solve` measures it from the placement)")
    p.add_argument("--expert-routing", choices=EXPERT_ROUTINGS, default=None,
                   help="tokens-per-expert skew of the measured expert kernels (default: the model's; balanced when --expert-imbalance is given)")
    p.add_argument("--isl", type=bounded(int, 1, MAX_INPUT_TOKENS), help="input (prompt) tokens per request (default 2048, or the problem's)")
    p.add_argument("--osl", type=bounded(int, 1, MAX_OUTPUT_TOKENS), help="output tokens per request (default 256, or the problem's)")
    precisions = [p.value for p in Precision]
    p.add_argument("--weights-precision", choices=precisions, help="weight format (default: the model's native one)")
    p.add_argument("--kv-precision", choices=precisions, help="KV-cache format (default bf16)")
    p.add_argument("--activations-precision", choices=precisions, help="activation format (default bf16)")
    p.add_argument("--compute-precision", choices=precisions, help="matmul format (default: the weights')")
    p.add_argument("--price", type=positive(float, MAX_PRICE_USD_PER_ACCELERATOR_HOUR), help="USD per accelerator-hour instead of the catalog estimate")
    p.add_argument("--overlap", choices=[o.value for o in OverlapPolicy], default=OverlapPolicy.SERIAL.value,
                   help="serial: communication adds to the step (default); overlapped: hidden behind compute/memory")
    p.add_argument("--engine", choices=[e.value for e in Engine], help="serving engine whose kernel rates calibrate the step (default trtllm, or the problem's)")
    p.add_argument("--step-model", choices=[m.value for m in StepModel], default=StepModel.CALIBRATED.value,
                   help="calibrated: measured kernel rates (what the engine reaches, default); roofline: the ideal bound")
    p.add_argument("--prefill-chunk", type=bounded(int, 64, MAX_PREFILL_CHUNK_TOKENS), help="tokens per prefill forward pass (default: the planner's chunked-prefill budget)")
    p.add_argument("--role", choices=[r.value for r in ServingRole], default=ServingRole.AGGREGATED.value,
                   help="aggregated (prefill rides in the decode steps, default), or one replica of a prefill or decode pool")
    p.add_argument("--speculative-tokens", type=bounded(int, 0, MAX_DRAFT_TOKENS), metavar="K",
                   help="speculative decoding with the model's MTP modules: draft tokens each step verifies (default 0, or the "
                        "problem workload's fixed number)")
    p.add_argument("--acceptance", type=acceptance_rates, metavar="A1,A2,...",
                   help="with --speculative-tokens: acceptance per draft position on your data, e.g. 0.9,0.7,0.4 (default: the "
                        "model catalog's published rates)")
    p.add_argument("--acceptance-length", type=bounded(float, 1.0, 1.0 + MAX_DRAFT_TOKENS), metavar="L",
                   help="with --speculative-tokens: the measured mean tokens a step emits per sequence, instead of --acceptance")
    p.add_argument("--cache-tier", metavar="TIER",
                   help="with a problem whose workload declares prefix_cache: the KV tier its cached prefixes wait in "
                        "(hbm, host-dram, local-flash, remote-storage; default: the problem's tier unless it is auto)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON (SI units)")
    p.set_defaults(handler="planner.cli.estimate:estimate_command")


def _add_solve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="choose the cheapest deployment of every workload on the fleet (CP-SAT)",
                       description="Enumerate layouts with the roofline, let CP-SAT choose rack types, layouts, batches and "
                                   "replica counts, and explain the plan. Exit code 0 with a plan, 2 for bad input, 3 when infeasible.")
    p.add_argument("problem", help="problem file, or the name of a bundled problem (see problems/)")
    p.add_argument("--json", metavar="PATH", help="write the plan as JSON (SI units)")
    p.add_argument("--time-limit", type=positive(float, MAX_TIME_LIMIT_S), default=None, help="CP-SAT time limit in seconds (default: the problem's)")
    p.add_argument("--seed", type=bounded(int, 0, MAX_SEED), default=None, help="CP-SAT random seed (default: the problem's)")
    p.add_argument("--workers", type=positive(int, 64), default=None, help="CP-SAT worker threads (default: the problem's)")
    p.add_argument("--confidence", choices=[c.value for c in Confidence], default=None,
                   help="high: plan so that TPOT and TTFT limits hold at the slow end (p90) of the predictions' range "
                        "(default: the problem's, median)")
    p.set_defaults(handler="planner.cli.plans:solve_command")


def _add_plan_commands(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="export a solved plan for a serving stack",
                            description="Write the plan's placement (json) or launch scripts for vLLM, SGLang or TensorRT-LLM.")
    export.add_argument("plan", help="plan JSON written by `planner solve --json`")
    export.add_argument("--format", choices=[f.value for f in ExportFormat], default=None,
                        help="json: placement document; vllm, sglang, trtllm: a launch script (default: the plan's engine); "
                             "lws: Kubernetes LeaderWorkerSet manifests")
    export.add_argument("--engine", choices=[e.value for e in Engine], default=None, help="engine of lws manifests (default: the plan's)")
    export.add_argument("-o", "--output", help="write to a file instead of standard output")
    export.set_defaults(handler="planner.cli.plans:export_command")
    check = sub.add_parser("check", help="verify a plan independently of the solver (exit 0 valid, 1 invalid)",
                           description="Reload a plan and re-derive everything from its problem and the roofline: HBM, latency "
                                       "limits, demand, rack packing, accelerator placement and expert maps.")
    check.add_argument("plan", help="plan JSON written by `planner solve --json`")
    check.set_defaults(handler="planner.cli.plans:check_command")
    view = sub.add_parser("view", help="show a plan's placement rack by rack")
    view.add_argument("plan", help="plan JSON written by `planner solve --json`")
    view.add_argument("--rack", help="only this rack instance (gb200-nvl72#0) or rack type")
    view.add_argument("--plot", metavar="SVG|PNG", help="also draw the placement: .svg (no dependency) or .png (matplotlib)")
    view.add_argument("--colour-by", choices=["replica", "stage", "expert"], default="replica",
                      help="colour the accelerators of the picture by replica (default), pipeline stage or expert-parallel rank")
    view.set_defaults(handler="planner.cli.plans:view_command")


def _add_sweeps(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser("compare", help="plan the same workloads on each rack generation, side by side",
                             description="Re-plan the problem on each rack type alone and compare cost per token, throughput per "
                                         "accelerator, TPOT, accelerators and racks, and the binding limit.")
    compare.add_argument("problem", help="problem file, or the name of a bundled problem")
    compare.add_argument("--racks", help="comma-separated rack ids (default: every rack type in the catalog)")
    compare.add_argument("--count", type=positive(int, MAX_RACKS_PER_TYPE), default=None, help="racks of each type (default: as many as the plan needs)")
    compare.add_argument("--time-limit", type=positive(float, MAX_TIME_LIMIT_S), default=None, help="CP-SAT time limit per rack type, seconds")
    compare.add_argument("--plot", metavar="PNG", help="also draw the comparison")
    compare.add_argument("--json", metavar="PATH", help="also write the rows as JSON (SI units)")
    compare.set_defaults(handler="planner.cli.studies:compare_command")
    frontier = sub.add_parser("frontier", help="the Pareto frontier of cost per token against per-user speed",
                              description="Sweep one workload's TPOT limit from the fastest achievable to the HBM-bound batch, solving "
                                          "each point with CP-SAT warm-started from the previous one; report the frontier.")
    frontier.add_argument("problem", help="problem file, or the name of a bundled problem")
    frontier.add_argument("--workload", help="workload to sweep (needed when the problem has several)")
    frontier.add_argument("--points", type=bounded(int, 2, MAX_FRONTIER_POINTS), default=16, help="TPOT limits to try (default 16)")
    frontier.add_argument("--min-tpot-ms", type=positive(float), default=None, help="tightest TPOT limit (default: the fastest layout's)")
    frontier.add_argument("--max-tpot-ms", type=positive(float), default=None, help="loosest TPOT limit (default: HBM-bound batches)")
    frontier.add_argument("--time-limit", type=positive(float, MAX_TIME_LIMIT_S), default=None, help="CP-SAT time limit per point, seconds")
    frontier.add_argument("--plot", metavar="PNG", help="also draw the frontier")
    frontier.add_argument("--csv", metavar="CSV", help="also write every point as CSV")
    frontier.add_argument("--json", metavar="PATH", help="also write every point as JSON (SI units)")
    frontier.set_defaults(handler="planner.cli.studies:frontier_command")
    curve = sub.add_parser("curve", help="cost per token and TPOT against batch size for the planned deployment",
                           description="Solve the problem, take the workload's deployment and evaluate it over its batch range: "
                                       "weight amortisation (cost ~ 1/B) down to the compute and KV floor, the plan's batch marked.")
    curve.add_argument("problem", help="problem file, or the name of a bundled problem")
    curve.add_argument("--workload", help="workload to use (needed when the problem has several)")
    curve.add_argument("--points", type=bounded(int, 2, MAX_CURVE_POINTS), default=48, help="batch sizes to evaluate (default 48)")
    curve.add_argument("--plot", metavar="PNG", help="also draw the curve")
    curve.add_argument("--csv", metavar="CSV", help="also write every batch as CSV")
    curve.add_argument("--json", metavar="PATH", help="also write the curve as JSON (SI units)")
    curve.set_defaults(handler="planner.cli.studies:curve_command")
    sweep = sub.add_parser("sweep", help="solve a design space: a problem varied along axes, one tidy table",
                           description="Expand a sweep file (`planner schema --sweep`) into problems, solve each (local worker processes "
                                       "or a Ray cluster), and write a table (CSV, Parquet), charts and a summary. Resumes from --out.")
    sweep.add_argument("spec", help="sweep file (YAML)")
    sweep.add_argument("--out", required=True, help="output directory (rows.jsonl, <name>.csv/.parquet, charts, summary.md)")
    sweep.add_argument("--workers", type=positive(int, 256), default=1, help="local worker processes (default 1)")
    sweep.add_argument("--ray", metavar="ADDRESS", help="run on Ray: a cluster address, 'auto', or 'local' to start one here")
    sweep.add_argument("--time-limit", type=positive(float, MAX_TIME_LIMIT_S), default=None, help="CP-SAT time limit per point (default: the file's)")
    sweep.add_argument("--restart", action="store_true", help="discard rows of a different sweep found in --out")
    sweep.set_defaults(handler="planner.cli.studies:sweep_command")


def _add_economics(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="prompt-caching economics: break-even retention per KV tier, hit discount",
                           description="Solve the problem, then for each workload's deployment and each KV tier: the cost of "
                                       "holding cached tokens, the retention beyond which recomputing is cheaper, reload time, "
                                       "and the discount of a hit against a miss.")
    cache.add_argument("problem", help="problem file, or the name of a bundled problem")
    cache.add_argument("--workload", help="only this workload")
    cache.add_argument("--time-limit", type=positive(float, MAX_TIME_LIMIT_S), default=None, help="CP-SAT time limit, seconds")
    cache.add_argument("--json", metavar="PATH", help="also write the figures as JSON (SI units)")
    cache.set_defaults(handler="planner.cli.economics:cache_command")
    prices = sub.add_parser("prices", help="read a provider's prices backwards: KV bytes per token, memory-boundness, cache tiers",
                            description="From public prices (input, output, cached input, a long-context step, cache-write "
                                        "retentions) infer what they imply under the roofline, with the working shown.")
    prices.add_argument("sheet", help="price sheet YAML (examples/prices/ has two)")
    prices.add_argument("--model", default="deepseek-v3", help="model whose active parameters and KV format to assume (default deepseek-v3)")
    prices.add_argument("--active-params", type=positive(float), default=None, help="assume this many active parameters instead")
    prices.add_argument("--accelerator", default="gb200", help="accelerator whose F, BW and price to assume (default gb200)")
    prices.add_argument("--precision", default=FlopsFormat.BF16.value, choices=[f.value for f in FlopsFormat], help="matched precision of F and the KV (default bf16)")
    prices.add_argument("--json", metavar="PATH", help="also write the reading as JSON")
    prices.set_defaults(handler="planner.cli.economics:prices_command")
    life = sub.add_parser("lifecycle", help="pre-training, RL and inference over a model's life, and how far past Chinchilla",
                          description="Compute and cost of pre-training (6ND), RL (2-6ND) and inference (2ND) for a model, a "
                                      "serving rate and a lifetime; the token counts where they balance, the Chinchilla ratio, "
                                      "and the pipeline bubble of the training layout.")
    life.add_argument("--model", default="deepseek-v3", help="catalog model for the active parameters (default deepseek-v3)")
    life.add_argument("--active-params", type=positive(float), default=None, help="active parameters instead of a catalog model")
    life.add_argument("--serving-tokens-per-s", type=positive(float), default=5e7, help="tokens served per second (default 5e7, the lecture's frontier scale)")
    life.add_argument("--lifetime-days", type=positive(float, 36_500), default=60, help="days the model serves (default 60)")
    life.add_argument("--pretrain-tokens", type=positive(float), default=None, help="compare with an actual pre-training token count")
    life.add_argument("--rl-flops-per-token", type=rl_factor, default=4.0, help="RL FLOPs per parameter and token, 2-6 (default 4)")
    life.add_argument("--problem", help="price inference tokens with this problem's plan (its first workload)")
    life.add_argument("--inference-usd-per-million", type=positive(float), default=None, help="or give the inference cost per million tokens")
    life.add_argument("--accelerator", default="gb200", help="training accelerator (default gb200)")
    life.add_argument("--precision", default=FlopsFormat.BF16.value, choices=[f.value for f in FlopsFormat], help="training matmul format (default bf16)")
    life.add_argument("--training-accelerators", type=positive(int, 10_000_000), default=8192, help="accelerators training (default 8192)")
    life.add_argument("--pp", type=positive(int, 4096), default=8, help="pipeline stages of the training layout (default 8)")
    life.add_argument("--micro-batches", type=positive(int, 1_000_000), default=32, help="micro-batches per training step (default 32)")
    life.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    life.set_defaults(handler="planner.cli.economics:lifecycle_command")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="the planner over HTTP (JSON under /v1/) and a web page at /",
                       description="Serve the planner's commands as JSON endpoints and a web page. Binds 127.0.0.1 unless --host "
                                   "says otherwise. Needs the optional extra: pip install 'llm-deployment-planner[serve]'.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=bounded(int, 1, 65535), default=8000, help="port (default 8000)")
    p.add_argument("--token", default=None, help="bearer token every /v1/ request must carry (default: $PLANNER_SERVE_TOKEN; none: open)")
    p.add_argument("--workers", type=bounded(int, 1, 64), default=2, help="requests worked on at once (default 2)")
    p.add_argument("--backlog", type=bounded(int, 0, 1024), default=4, help="requests waiting for a worker; more are answered 503 (default 4)")
    p.add_argument("--time-limit", type=positive(float, MAX_TIME_LIMIT_S), default=30.0, help="CP-SAT time limit of one solve, at most (default 30 s)")
    p.add_argument("--request-timeout", type=positive(float, MAX_TIME_LIMIT_S), default=120.0,
                   help="seconds a request may take before it is answered 504 (default 120)")
    p.add_argument("--max-body-bytes", type=bounded(int, 1024, 1 << 30), default=1 << 20, help="largest request body (default 1 MiB)")
    p.add_argument("--sweep-points", type=bounded(int, 1, MAX_SWEEP_PROBLEMS), default=64, help="points one sweep job may have (default 64)")
    p.add_argument("--sweeps", type=bounded(int, 1, 64), default=1, help="sweep jobs running at once; more are answered 503 (default 1)")
    p.add_argument("--sweep-workers", type=bounded(int, 1, 256), default=1, help="local worker processes of one sweep job (default 1)")
    p.add_argument("--sweep-ray", metavar="ADDRESS", default=None, help="run sweep jobs on Ray (a cluster address, 'auto' or 'local'); default: local workers")
    p.set_defaults(handler="planner.service.server:serve_command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description="Plan LLM deployments on clusters and cost each token.")
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_solve(sub)
    _add_estimate(sub)
    _add_plan_commands(sub)
    _add_sweeps(sub)
    _add_economics(sub)
    schema = sub.add_parser("schema", help="print the JSON Schema of problem files (or a Markdown reference)")
    schema.add_argument("--markdown", action="store_true", help="the field reference as Markdown tables (as in the README)")
    schema.add_argument("--plan", action="store_true", help="the JSON Schema of plan files (planner solve --json) instead")
    schema.add_argument("--sweep", action="store_true", help="the JSON Schema of sweep files (planner sweep) instead")
    schema.add_argument("-o", "--output", help="write to a file instead of standard output")
    schema.set_defaults(handler="planner.cli.catalog:schema_command")
    _add_serve(sub)
    cal = sub.add_parser("calibrate", help="fit the kernel-rate curves of the step model to measured kernel tables",
                         description="Read aiconfigurator-core's measured kernel tables (an unpacked systems/data directory or the "
                                     "wheel file) and write the curves and correction grids the calibrated step model uses "
                                     "(kernels.yaml and kernel_grids/ next to it), with each kernel class's leave-one-out error. "
                                     "Needs the optional extra: pip install 'llm-deployment-planner[calibrate]'.")
    cal.add_argument("tables", help="aiconfigurator_core/systems/data directory, an unpacked wheel, the .whl file, or a `planner probe` directory")
    cal.add_argument("-o", "--output", "--out", help="where to write the curves; the grids go to kernel_grids/ beside it (default "
                     "topologies/kernels.yaml); for a probe directory: the user catalog directory to write (required)")
    cal.add_argument("--systems", nargs="+", help="only these systems (h100_sxm or h100-sxm; default all six)")
    cal.add_argument("--engines", nargs="+", choices=[e.value for e in Engine], help="only these engines (default all three)")
    probe = cal.add_argument_group("a probe directory")
    probe.add_argument("--accelerator", help="the probed part's accelerator id, whose peaks the fits use (default: matched from the probed device's name)")
    probe.add_argument("--accelerators", metavar="FILE", help="accelerators and racks outside the catalog: a file with accelerators: and racks: "
                       "lists, or a problem file (its custom_accelerators and custom_racks)")
    probe.add_argument("--name", help="id of the new accelerator the user catalog defines (default <accelerator>-probed)")
    probe.add_argument("--engine", choices=[e.value for e in Engine], help="engine key the probed curves go under (default vllm; any engine falls back to it)")
    cal.set_defaults(handler="planner.cli.calibrate:calibrate_command")
    _add_probe(sub)
    catalog = sub.add_parser("catalog", help="list accelerators, racks, models and KV-cache tiers with their key numbers")
    catalog.add_argument("section", nargs="?", choices=["accelerators", "racks", "models", "kv-tiers"], help="only this section")
    catalog.add_argument("--json", metavar="PATH", help="also write the catalog as JSON")
    catalog.set_defaults(handler="planner.cli.catalog:catalog_command")
    return parser
