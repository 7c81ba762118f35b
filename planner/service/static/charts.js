// Charts drawn as inline SVG by this file alone (no library, works offline).
"use strict";
const SVGNS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceTicks(low, high, count) {
  const span = Math.max(high - low, 1e-12);
  const step0 = span / count;
  const mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= step0);
  const ticks = [];
  for (let t = Math.ceil(low / step) * step; t <= high + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}

function frame(width, height, title) {
  const svg = svgEl("svg", {width, height, viewBox: `0 0 ${width} ${height}`, "font-family": "sans-serif", "font-size": 12});
  svg.appendChild(svgEl("rect", {width, height, fill: "white"}));
  svg.appendChild(svgEl("text", {x: 10, y: 18, "font-weight": 600}, title));
  return svg;
}

// rows: [{label, value, low, high, note}], bars with their p10-p90 range as whiskers
function barChart(container, rows, opts) {
  const width = 760, barH = 26, left = 170, right = 150, top = 34;
  const height = top + rows.length * (barH + 8) + 40;
  const svg = frame(width, height, opts.title);
  svg.setAttribute("class", "bar-chart");
  const max = Math.max(...rows.map(r => Math.max(r.high ?? r.value, r.value)), 1e-12) * 1.05;
  const x = v => left + (width - left - right) * v / max;
  niceTicks(0, max, 5).forEach(t => {
    svg.appendChild(svgEl("line", {x1: x(t), x2: x(t), y1: top - 4, y2: height - 30, stroke: "#eee"}));
    svg.appendChild(svgEl("text", {x: x(t), y: height - 16, "text-anchor": "middle", fill: "#555"}, opts.format(t)));
  });
  rows.forEach((r, i) => {
    const y = top + i * (barH + 8);
    svg.appendChild(svgEl("text", {x: left - 8, y: y + barH * 0.65, "text-anchor": "end"}, r.label));
    if (r.value === null || r.value === undefined) {
      svg.appendChild(svgEl("text", {x: left + 4, y: y + barH * 0.65, fill: "#a00"}, r.note || "no plan"));
      return;
    }
    const bar = svgEl("rect", {x: left, y, width: Math.max(1, x(r.value) - left), height: barH, fill: opts.colour(r, i), "data-label": r.label});
    bar.appendChild(svgEl("title", {}, `${r.label}: ${opts.format(r.value)}${r.note ? " (" + r.note + ")" : ""}`));
    svg.appendChild(bar);
    if (r.low !== undefined && r.high !== undefined) {
      const ym = y + barH / 2;
      svg.appendChild(svgEl("line", {x1: x(r.low), x2: x(r.high), y1: ym, y2: ym, stroke: "#333"}));
      [r.low, r.high].forEach(v => svg.appendChild(svgEl("line", {x1: x(v), x2: x(v), y1: ym - 6, y2: ym + 6, stroke: "#333"})));
    }
    svg.appendChild(svgEl("text", {x: x(Math.max(r.value, r.high ?? 0)) + 6, y: y + barH * 0.65}, opts.format(r.value) + (r.note ? "  " + r.note : "")));
  });
  svg.appendChild(svgEl("text", {x: left, y: height - 2, fill: "#555"}, opts.axis));
  container.replaceChildren(svg);
}

// points: [{x, y, label, highlight}], a line through the highlighted ones (the frontier)
function scatterChart(container, points, opts) {
  const width = 760, height = 380, left = 70, right = 20, top = 34, bottom = 46;
  const svg = frame(width, height, opts.title);
  svg.setAttribute("class", "scatter-chart");
  const xs = points.map(p => p.x), ys = points.map(p => p.y);
  const [x0, x1] = [0, Math.max(...xs) * 1.08], [y0, y1] = [0, Math.max(...ys) * 1.08];
  const X = v => left + (width - left - right) * (v - x0) / (x1 - x0 || 1);
  const Y = v => height - bottom - (height - top - bottom) * (v - y0) / (y1 - y0 || 1);
  niceTicks(x0, x1, 6).forEach(t => {
    svg.appendChild(svgEl("line", {x1: X(t), x2: X(t), y1: top, y2: height - bottom, stroke: "#eee"}));
    svg.appendChild(svgEl("text", {x: X(t), y: height - bottom + 16, "text-anchor": "middle", fill: "#555"}, opts.formatX(t)));
  });
  niceTicks(y0, y1, 5).forEach(t => {
    svg.appendChild(svgEl("line", {x1: left, x2: width - right, y1: Y(t), y2: Y(t), stroke: "#eee"}));
    svg.appendChild(svgEl("text", {x: left - 6, y: Y(t) + 4, "text-anchor": "end", fill: "#555"}, opts.formatY(t)));
  });
  const front = points.filter(p => p.highlight).sort((a, b) => a.x - b.x);
  if (front.length > 1) {
    svg.appendChild(svgEl("polyline", {points: front.map(p => `${X(p.x)},${Y(p.y)}`).join(" "), fill: "none", stroke: "#4e79a7", "stroke-width": 2}));
  }
  points.forEach(p => {
    const dot = svgEl("circle", {cx: X(p.x), cy: Y(p.y), r: p.highlight ? 5 : 3.5, fill: p.highlight ? "#4e79a7" : "#bab0ac", class: "point"});
    dot.appendChild(svgEl("title", {}, p.label));
    svg.appendChild(dot);
  });
  svg.appendChild(svgEl("text", {x: (left + width - right) / 2, y: height - 8, "text-anchor": "middle"}, opts.axisX));
  const yl = svgEl("text", {x: 14, y: (top + height - bottom) / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${(top + height - bottom) / 2})`}, opts.axisY);
  svg.appendChild(yl);
  container.replaceChildren(svg);
}
