"""A picture of a plan's placement: every rack a block of hosts, every accelerator a cell coloured by
its deployment's replica, pipeline stage or expert-parallel rank. `placement_boxes` lays the cells
out once; `placement_svg` writes them as SVG (no dependency; `planner view --plot plan.svg` and the
web page's picture) and `placement_png` draws the same boxes with matplotlib.
"""

from dataclasses import dataclass
from html import escape
from pathlib import Path

from planner.modes import ServingRole
from planner.output.plan import Plan

__all__ = ["COLOUR_BY", "Box", "placement_boxes", "placement_png", "placement_svg"]

COLOUR_BY = ("replica", "stage", "expert")
# twelve distinguishable fills (Tableau 10 plus two), cycled when there are more groups
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
           "#86bcb6", "#d37295"]
IDLE, BROKEN = "#f4f4f4", "#444444"
POOL_MARK = {ServingRole.PREFILL: " P", ServingRole.DECODE: " D", ServingRole.AGGREGATED: ""}
CELL_W, CELL_H, GAP, HOSTS_PER_COLUMN, TITLE_H, MARGIN, TEXT_W = 62, 34, 3, 9, 20, 10, 7.0  # pixels; TEXT_W: a 13 px character


@dataclass(frozen=True)
class Box:
    """One drawn thing: a cell (an accelerator) or a text line (`fill` None), in pixels from the top left."""

    x: float
    y: float
    w: float
    h: float
    fill: str | None
    text: str
    title: str = ""


def _cells(plan: Plan, colour_by: str) -> dict[str, tuple[str, str, str]]:
    """accelerator -> (fill, label, tooltip). Deployments are numbered from 1 (the legend's numbers);
    each (deployment, replica) or (deployment, stage) takes the next palette colour in turn."""
    cells, groups = {}, {}
    for i, d in enumerate(plan.deployments):
        kind = POOL_MARK[d.role]
        for role in d.placement:
            expert = role.ep_rank
            if colour_by == "expert" and expert is not None:
                fill = f"hsl({360.0 * expert / max(d.ep, 1):.0f},65%,55%)"
            else:
                key = (i, role.stage if colour_by == "stage" else role.replica)
                fill = PALETTE[groups.setdefault(key, len(groups)) % len(PALETTE)]
            label = f"{i + 1}:{d.workload[:7]}{kind}\nr{role.replica} s{role.stage}" + (f" e{expert}" if expert is not None else "")
            tip = (f"{role.accelerator}: deployment {i + 1}, {d.workload} {d.role}, replica {role.replica}, "
                   f"stage {role.stage} (layers {role.layers[0]}-{role.layers[1] - 1}), tp rank {role.tp_rank}, "
                   f"dp rank {role.dp_rank}" + (f", expert rank {expert}" if expert is not None else ""))
            cells[role.accelerator] = (fill, label, tip)
    return cells


def _legend(plan: Plan, colour_by: str) -> list[str]:
    return [f"colour: {colour_by}; cells: deployment:workload (P prefill, D decode pool), replica r, stage s, expert rank e"] + \
        [f"{i + 1}: {d.workload}{'' if d.role is ServingRole.AGGREGATED else f' {d.role}'}, {d.replicas} x "
         f"TP{d.tp} DPattn{d.dp_attn} EP{d.ep} PP{d.pp} on {d.rack}" for i, d in enumerate(plan.deployments)]


def placement_boxes(plan: Plan, colour_by: str = "replica", rack_filter: str | None = None) -> tuple[list[Box], float, float]:
    """The boxes of the picture and its width and height (only the rack instance or type `rack_filter`
    when given). Racks with nothing placed are summed up in one line at the end."""
    cells = _cells(plan, colour_by)
    boxes: list[Box] = []
    y, width, idle = MARGIN, 600.0, []
    for line in _legend(plan, colour_by):
        boxes.append(Box(MARGIN, y, 0, TITLE_H, None, line))
        width, y = max(width, MARGIN + TEXT_W * len(line)), y + TITLE_H
    for name, info in plan.racks.items():
        if rack_filter and rack_filter not in (name, name.split("#")[0]):
            continue
        size, host = info.accelerators, max(1, min(info.accelerators_per_host, info.accelerators))
        used = sum(1 for k in range(size) if f"{name}/{k}" in cells)
        if not used:
            idle.append(name)
            continue
        boxes.append(Box(MARGIN, y, 0, TITLE_H, None, f"{name}: {used}/{size} accelerators in use"))
        y += TITLE_H
        broken = set(info.unavailable)
        for k in range(size):
            h_index, slot = divmod(k, host)
            column, row = divmod(h_index, HOSTS_PER_COLUMN)
            x = MARGIN + column * (host * (CELL_W + GAP) + 3 * GAP) + slot * (CELL_W + GAP)
            node = f"{name}/{k}"
            fill, label, tip = (BROKEN, "x", f"{node}: unavailable") if k in broken else cells.get(node, (IDLE, "", f"{node}: idle"))
            boxes.append(Box(x, y + row * (CELL_H + GAP), CELL_W, CELL_H, fill, label, tip))
            width = max(width, x + CELL_W + MARGIN)
        y += min(-(-size // host), HOSTS_PER_COLUMN) * (CELL_H + GAP) + GAP
    if idle:
        boxes.append(Box(MARGIN, y, 0, TITLE_H, None, f"idle racks: {len(idle)} ({', '.join(idle[:6])}{', ...' if len(idle) > 6 else ''})"))
        y += TITLE_H
    return boxes, width, y + MARGIN


def placement_svg(plan: Plan, colour_by: str = "replica", rack_filter: str | None = None) -> str:
    """The placement as a standalone SVG document."""
    boxes, width, height = placement_boxes(plan, colour_by, rack_filter)
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
              'font-family="sans-serif" class="placement">'), f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>']
    for b in boxes:
        if b.fill is None:
            parts.append(f'<text x="{b.x:.0f}" y="{b.y + b.h * 0.7:.0f}" font-size="13" fill="#222">{escape(b.text)}</text>')
            continue
        ink = "#fff" if b.fill in (BROKEN,) else "#111"
        lines = b.text.split("\n")
        text = "".join(f'<tspan x="{b.x + b.w / 2:.0f}" dy="{0 if k == 0 else 11}">{escape(line)}</tspan>' for k, line in enumerate(lines))
        parts.append(f'<g><title>{escape(b.title)}</title><rect x="{b.x:.0f}" y="{b.y:.0f}" width="{b.w:.0f}" height="{b.h:.0f}" '
                     f'rx="3" fill="{b.fill}" stroke="#888" stroke-width="0.5"/>'
                     f'<text y="{b.y + b.h / 2 + 3 - 5.5 * (len(lines) - 1):.0f}" font-size="9" text-anchor="middle" fill="{ink}">{text}</text></g>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _matplotlib_colour(fill: str) -> object:
    if fill.startswith("hsl("):
        import colorsys

        hue, sat, light = (float(v.rstrip("%")) for v in fill[4:-1].split(","))
        return colorsys.hls_to_rgb(hue / 360.0, light / 100.0, sat / 100.0)
    return fill


def placement_png(plan: Plan, path: str | Path, colour_by: str = "replica", rack_filter: str | None = None) -> Path:
    """The same boxes drawn with matplotlib (Agg) into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    boxes, width, height = placement_boxes(plan, colour_by, rack_filter)
    dpi = 100
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for b in boxes:
        if b.fill is None:
            ax.text(b.x, b.y + b.h * 0.7, b.text, fontsize=9, color="#222")
            continue
        ax.add_patch(Rectangle((b.x, b.y), b.w, b.h, facecolor=_matplotlib_colour(b.fill), edgecolor="#888", linewidth=0.5))
        ax.text(b.x + b.w / 2, b.y + b.h / 2, b.text, fontsize=5.5, ha="center", va="center", color="#fff" if b.fill == BROKEN else "#111")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=dpi)
    plt.close(fig)
    return target
