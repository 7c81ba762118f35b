"""`planner view`: the placement of a plan, rack by rack, one row per host."""

from rich.console import Console
from rich.table import Table

from planner.modes import ServingRole
from planner.output.placement_picture import POOL_MARK
from planner.output.plan import Plan, PlanDeployment

__all__ = ["render_placement"]

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta", "bright_green", "bright_yellow"]


def _labels(plan: Plan) -> dict[str, tuple[str, str]]:
    """accelerator -> (cell text, colour)."""
    cells = {}
    for i, d in enumerate(plan.deployments):
        colour = COLOURS[i % len(COLOURS)]
        for role in d.placement:
            text = f"{d.workload[:8]}{POOL_MARK[d.role]}\nr{role.replica} s{role.stage}"
            if role.ep_rank is not None:
                text += f" e{role.ep_rank}"
            cells[role.accelerator] = (text, colour)
    return cells


def _role(d: PlanDeployment) -> str:
    return "" if d.role is ServingRole.AGGREGATED else f" {d.role}"


def render_placement(plan: Plan, console: Console, rack_filter: str | None = None) -> None:
    racks = plan.racks
    cells = _labels(plan)
    legend = ", ".join(f"[{COLOURS[i % len(COLOURS)]}]{d.workload}{_role(d)} ({d.rack}, {d.replicas} x "
                       f"TP{d.tp} DPattn{d.dp_attn} EP{d.ep} PP{d.pp})[/]" for i, d in enumerate(plan.deployments))
    console.print(f"Deployments: {legend}")
    console.print("cells: workload (P prefill, D decode pool), replica r, pipeline stage s, expert rank e; "
                  "[dim]· idle[/dim], [red]x unavailable[/red]")
    for name, info in racks.items():
        rack_id = name.split("#")[0]
        if rack_filter and rack_filter not in (name, rack_id):
            continue
        size = info.accelerators
        host = info.accelerators_per_host
        used = sum(1 for k in range(size) if f"{name}/{k}" in cells)
        if not used and not rack_filter:
            continue  # idle racks are summarised below
        console.print(f"[bold]{name}[/bold]: {used}/{size} accelerators in use")
        table = Table(show_header=False, box=None, padding=(0, 1))
        for _ in range(min(host, size)):
            table.add_column(justify="center")
        broken = set(info.unavailable)
        for start in range(0, size, host):
            row = []
            for k in range(start, min(start + host, size)):
                node = f"{name}/{k}"
                if k in broken:
                    row.append("[red]x[/red]")
                elif node in cells:
                    text, colour = cells[node]
                    row.append(f"[{colour}]{text}[/{colour}]")
                else:
                    row.append("[dim]·[/dim]")
            table.add_row(*row)
        console.print(table)
    idle = [n for n in racks if not any(a.startswith(f"{n}/") for a in cells) and (not rack_filter or rack_filter in (n, n.split('#')[0]))]
    if idle:
        console.print(f"idle racks: {len(idle)} ({', '.join(idle[:6])}{', ...' if len(idle) > 6 else ''})")
