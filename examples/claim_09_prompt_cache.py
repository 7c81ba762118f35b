"""Claim 9: cached context is ~10x cheaper than recomputing it; the memory tier that should hold it
(HBM, host DRAM, flash, disk) follows from the retention time against storage cost per
byte-second and recompute cost.

DeepSeek-V3 on GB200 NVL72 serving a coding agent whose 30K-token context is 90% cached: the
break-even retention of each tier, the planned fleet with and without the cache, and the tiers a
provider's 5-minute and 1-hour cache options imply.
"""

import json
from pathlib import Path

from common import parse_args

from planner.output.cache_report import cache_economics
from planner.output.plan_report import solve_record
from planner.paths import data_dir
from planner.problem.resolve import resolve_problem
from planner.problem.schema import load_problem, parse_problem
from planner.solver.solve import solve
from planner.studies.prices import load_price_sheet, read_prices
from planner.units import format_duration

parse_args(__doc__)
problem = resolve_problem(load_problem(data_dir("problems") / "prompt-cache-coding-agent.yaml"))
planned = solve(problem, explain=False)
econ = cache_economics(planned, "agent")
print(f"recomputing a prompt token: ${econ.recompute_usd_per_million_tokens:.4f}/M; holding its {econ.kv_bytes_per_token:,.0f} bytes:")
for t in econ.tiers:
    print(f"  {t.tier.name:<34} ${t.usd_per_million_tokens_per_hour:9.4f}/M tokens/h   break-even {format_duration(t.break_even_s):>9}"
          f"   hit discount after 1 h: {t.discounts[0]:8.1f}x")
raw = json.loads(json.dumps(solve_record(planned)["problem_spec"]))
del raw["workloads"][0]["prefix_cache"]
uncached = solve(resolve_problem(parse_problem(raw)), explain=False)
tiers = sorted({d.candidate.kv_tier for d in planned.deployments})
without = f"${uncached.usd_per_hour:,.1f}/h" if uncached.has_plan else f"no plan fits the same fleet ({uncached.status})"
print(f"fleet with the prompt cache (in {', '.join(tiers)}): ${planned.usd_per_hour:,.1f}/h; without: {without}")
reading = read_prices(load_price_sheet(Path(__file__).parent / "prices" / "claude-sonnet.yaml"), active_params=1e11)
for line in reading.lines[-3:]:
    print(line)
flash = next(t for t in econ.tiers if t.tier.id == "local-flash")
print(f"claim 9: an hour on flash makes a hit {flash.discounts[0]:.0f}x cheaper than a miss (lecture: ~10x); HBM breaks even after "
      f"{format_duration(econ.tiers[0].break_even_s)}, flash after {format_duration(flash.break_even_s)}")
