// The planner's page: every figure comes from the /v1/ endpoints; this file only asks and draws.
"use strict";
const state = {problems: {}, name: null, plan: null, tab: "plan"};
const $ = id => document.getElementById(id);
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

function fmtSeconds(s) { return s === null || s === undefined ? "-" : s < 1 ? `${(s * 1000).toPrecision(3)} ms` : `${s.toPrecision(3)} s`; }
function fmtUsd(v, digits = 4) { return v === null || v === undefined ? "-" : `$${v.toFixed(digits)}`; }
function fmtRate(v) { return v === null || v === undefined ? "-" : v >= 1000 ? `${(v / 1000).toPrecision(3)}k/s` : `${v.toPrecision(3)}/s`; }
function layoutOf(d) { return `TP${d.tp} x DPattn${d.dp_attn} x EP${d.ep}` + (d.pp > 1 ? ` x PP${d.pp}` : ""); }

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function api(method, path, body) {
  const headers = {"Content-Type": "application/json"};
  if ($("token").value) headers.Authorization = `Bearer ${$("token").value}`;
  const response = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return (response.headers.get("content-type") || "").includes("json") ? response.json() : response.text();
}

async function busy(button, work) {
  button.disabled = true; button.classList.add("busy"); showError("");
  try { await work(); } catch (e) { showError(e.message); } finally { button.disabled = false; button.classList.remove("busy"); }
}

function problemRef() {
  const text = $("problem-doc").value;
  if (state.name && JSON.stringify(state.problems[state.name], null, 2) === text) return state.name;
  try { return JSON.parse(text); } catch (e) { throw new Error(`invalid input:\n  - problem: not valid JSON: ${e.message}\n    fix: correct the document`); }
}

function choose(name) {
  state.name = name;
  $("problem-doc").value = JSON.stringify(state.problems[name], null, 2);
  document.querySelectorAll("#bundled button").forEach(b => b.classList.toggle("chosen", b.dataset.name === name));
  updateUrl();
}

// Quick edit: [input id, read from the document (null: not applicable), write into it (empty value: remove)]
const QUICK = [
  ["qe-model", d => typeof d.model === "string" ? d.model : null, (d, v) => { d.model = v; }],
  ["qe-engine", d => d.engine || "trtllm", (d, v) => { d.engine = v; }],
  ["qe-objective", d => d.objective || "min_cost", (d, v) => { d.objective = v; }],
  ["qe-rack", d => d.cluster?.racks?.[0]?.type ?? null, (d, v) => { d.cluster.racks[0].type = v; }],
  ["qe-count", d => d.cluster?.racks?.[0] ? (d.cluster.racks[0].count ?? "") : null,
   (d, v) => { if (v === "") delete d.cluster.racks[0].count; else d.cluster.racks[0].count = Number(v); }],
  ["qe-isl", d => d.workloads?.[0]?.input_tokens ?? null, (d, v) => { d.workloads[0].input_tokens = Number(v); }],
  ["qe-osl", d => d.workloads?.[0]?.output_tokens ?? null, (d, v) => { d.workloads[0].output_tokens = Number(v); }],
  ["qe-tpot", d => d.workloads?.[0] ? (d.workloads[0].tpot_limit_ms ?? "") : null,
   (d, v) => { if (v === "") delete d.workloads[0].tpot_limit_ms; else d.workloads[0].tpot_limit_ms = Number(v); }],
  ["qe-ttft", d => d.workloads?.[0] ? (d.workloads[0].ttft_limit_ms ?? "") : null,
   (d, v) => { if (v === "") delete d.workloads[0].ttft_limit_ms; else d.workloads[0].ttft_limit_ms = Number(v); }],
  ["qe-demand", d => d.workloads?.[0] ? (d.workloads[0].demand?.output_tokens_per_s ?? "") : null,
   (d, v) => { if (v === "") delete d.workloads[0].demand; else d.workloads[0].demand = {output_tokens_per_s: Number(v)}; }],
];

function options(id, values) {
  $(id).replaceChildren(...values.map(v => { const o = document.createElement("option"); o.textContent = v; return o; }));
}

async function loadChoices() {
  const [catalog, schema] = await Promise.all([api("GET", "/v1/catalog"), api("GET", "/v1/schema/problem")]);
  options("qe-model", catalog.models.map(m => m.id));
  options("qe-rack", catalog.racks.map(r => r.id));
  options("qe-engine", schema.$defs.Engine.enum);
  options("qe-objective", schema.$defs.Objective.enum);
}

function fillQuick() {
  let doc = null;
  try { doc = JSON.parse($("problem-doc").value); } catch (e) { /* the document is being edited */ }
  QUICK.forEach(([id, read]) => {
    const value = doc ? read(doc) : null;
    $(id).disabled = value === null;
    if (value !== null) $(id).value = String(value);
  });
}

function applyQuick(id, write) {
  try {
    const doc = JSON.parse($("problem-doc").value);
    write(doc, $(id).value);
    $("problem-doc").value = JSON.stringify(doc, null, 2);
    updateUrl();
  } catch (e) { showError(`invalid input:\n  - problem: not valid JSON: ${e.message}\n    fix: correct the document`); }
}

async function useConfig() {
  let config;
  try { config = JSON.parse($("hf-config").value); } catch (e) { throw new Error(`invalid input:\n  - config: not valid JSON: ${e.message}\n    fix: paste the whole config.json`); }
  const doc = JSON.parse($("problem-doc").value);
  if (doc.model === undefined) throw new Error("invalid input:\n  - model: the document has several models\n    fix: edit its models section");
  doc.model = await api("POST", "/v1/model", {config, id: $("hf-id").value});
  $("problem-doc").value = JSON.stringify(doc, null, 2);
  updateUrl();
}

function fillWorkloads() {
  let names = [];
  try { const ref = problemRef(); const doc = typeof ref === "string" ? state.problems[ref] : ref; names = (doc.workloads || []).map(w => w.name); } catch (e) { /* shown on solve */ }
  const select = $("frontier-workload");
  const chosen = select.value;
  select.replaceChildren(...names.map(n => { const o = document.createElement("option"); o.textContent = n; return o; }));
  if (names.includes(chosen)) select.value = chosen;
}

function updateUrl() {
  fillWorkloads();
  fillQuick();
  const url = new URL(window.location.href);
  url.search = ""; url.hash = "";
  let ref;
  try { ref = problemRef(); } catch (e) { return; }
  if (typeof ref === "string") url.searchParams.set("problem", ref);
  else url.hash = "doc=" + btoa(unescape(encodeURIComponent(JSON.stringify(ref))));
  if ($("time-limit").value) url.searchParams.set("time_limit", $("time-limit").value);
  if (state.tab !== "plan") url.searchParams.set("tab", state.tab);
  history.replaceState(null, "", url);
  $("share-url").value = url.toString();
}

function solveBody() {
  const body = {problem: problemRef()};
  if ($("time-limit").value) body.time_limit = Number($("time-limit").value);
  return body;
}

function row(cells, header) {
  const tr = document.createElement("tr");
  cells.forEach(c => {
    const td = document.createElement(header ? "th" : "td");
    td.textContent = c;
    if (!/^[-$\d.]/.test(c) || TEXT_COLUMNS.has(c)) td.className = "text";
    tr.appendChild(td);
  });
  return tr;
}
const TEXT_COLUMNS = new Set(["workload", "role", "rack", "layout", "binds", "dominant", "plan", "status"]);

const STEP_TERMS = {compute: "compute", weights: "weights fetch", kv: "KV fetch", comm: "communication", overhead: "kernel floors + elementwise"};
const PLAN_COLUMNS = ["workload", "role", "rack", "layout", "batch", "replicas", "accelerators", "TPOT", "TTFT", "output tok/s",
                      "$/h", "$/M out", "$/M out p10-p90", "binds", "dominant"];

function renderPlan(plan) {
  state.plan = plan;
  const s = plan.solver;
  $("summary").textContent = `${plan.problem}: ${plan.status}` + (s.objective !== null ? `, objective ${s.objective} ${s.objective_unit}` : "")
    + (plan.fleet.usd_per_hour ? `; fleet ${fmtUsd(plan.fleet.usd_per_hour, 2)}/h on ${plan.fleet.accelerators} accelerators` : "");
  const table = $("plan-table");
  table.tHead.replaceChildren(row(PLAN_COLUMNS, true));
  table.tBodies[0].replaceChildren(...plan.deployments.map(d => row([
    d.workload, d.role, d.rack, layoutOf(d), String(d.batch_per_replica), String(d.replicas), String(d.accelerators),
    fmtSeconds(d.tpot_s), fmtSeconds(d.ttft_s), fmtRate(d.output_tokens_per_s), fmtUsd(d.usd_per_hour, 2),
    fmtUsd(d.usd_per_million_output_tokens), d.usd_per_million_output_tokens_range ? d.usd_per_million_output_tokens_range.map(v => fmtUsd(v)).join(" - ") : "-",
    d.batch_limit, d.dominant_term])));
  const items = [];
  const e = plan.explanation;
  if (e) {
    e.deployments.forEach(d => items.push(`${d.workload} on ${d.rack}: ${d.binding}; ${d.dominant}`));
    e.fleet.forEach(t => items.push(t));
    if (e.alternative) items.push(`best rejected alternative: ${e.alternative.description} (${e.alternative.reason})`);
  }
  if (plan.infeasibility) {
    items.push(plan.infeasibility.summary);
    plan.infeasibility.conflicts.forEach(c => items.push(c.message + (c.relax.length ? `; least relaxation: ${c.relax.join("; ")}` : "")));
  }
  $("explanation").replaceChildren(...items.map(t => { const li = document.createElement("li"); li.textContent = t; return li; }));
  $("costs").replaceChildren(...plan.deployments.map(d => {
    const li = document.createElement("li");
    const r = d.usd_per_million_output_tokens_range || [];
    const step = d.step_time_s || {};
    const terms = Object.entries(STEP_TERMS).filter(([k]) => step[k]).map(([k, label]) => `${label} ${fmtSeconds(step[k])}`);
    li.textContent = `${d.workload}: ${fmtUsd(d.usd_per_million_output_tokens)} per million output tokens (p10-p90 ${fmtUsd(r[0])} - ${fmtUsd(r[1])}), `
      + `TPOT ${fmtSeconds(d.tpot_s)} (${(d.tpot_s_range || []).map(fmtSeconds).join(" - ")}), ${fmtUsd(d.usd_per_hour, 2)}/h`
      + (terms.length ? `; decode step: ${terms.join(", ")} = ${fmtSeconds(step.total)}` : "");
    return li;
  }));
}

async function drawPlacement() {
  if (!state.plan || !state.plan.deployments.length) { $("placement").textContent = "No placement: no plan."; return; }
  $("placement").innerHTML = await api("POST", "/v1/view", {plan: state.plan, colour_by: $("colour-by").value});
}

async function solve() {
  updateUrl();
  renderPlan(await api("POST", "/v1/solve", solveBody()));
  await drawPlacement();
}

async function compare() {
  const racks = $("compare-racks").value.split(",").map(r => r.trim()).filter(Boolean);
  const body = {problem: problemRef(), racks};
  if ($("time-limit").value) body.time_limit = Number($("time-limit").value);
  const answer = await api("POST", "/v1/compare", body);
  const rackIds = [...new Set(answer.rows.map(r => r.rack_id))];
  const rows = answer.rows.map(r => ({label: `${r.rack_id} (${r.workload})`, value: r.usd_per_million_output_tokens, rack: rackIds.indexOf(r.rack_id),
                                      note: r.usd_per_million_output_tokens === null ? r.note || r.status : `${r.layouts}`}));
  barChart($("compare-chart"), rows, {title: "Cost per million output tokens on each rack type alone", axis: "USD per million output tokens",
                                      format: v => fmtUsd(v, 3), colour: r => PALETTE[r.rack % PALETTE.length]});
  const table = $("compare-table");
  table.tHead.replaceChildren(row(["rack", "workload", "status", "$/M out", "tok/s per acc.", "TPOT", "accelerators", "racks", "$/h", "binds", "plan"], true));
  table.tBodies[0].replaceChildren(...answer.rows.map(r => row([r.rack_id, r.workload, r.status, fmtUsd(r.usd_per_million_output_tokens),
    r.output_tokens_per_s_per_accelerator === null ? "-" : r.output_tokens_per_s_per_accelerator.toFixed(0), fmtSeconds(r.tpot_s),
    String(r.accelerators ?? "-"), String(r.racks_used ?? "-"), fmtUsd(r.usd_per_hour, 2), r.binding || "-", r.layouts || r.note || ""])));
}

async function frontier() {
  const body = {problem: problemRef(), points: Number($("frontier-points").value) || 8};
  if ($("frontier-workload").value) body.workload = $("frontier-workload").value;
  const answer = await api("POST", "/v1/frontier", body);
  const points = answer.points.filter(p => p.usd_per_million_output_tokens !== null).map(p => ({
    x: p.tokens_per_s_per_user, y: p.usd_per_million_output_tokens, highlight: p.on_frontier,
    label: `TPOT ${fmtSeconds(p.tpot_s)}: ${fmtUsd(p.usd_per_million_output_tokens)}/M, ${p.plan}`}));
  scatterChart($("frontier-chart"), points, {title: `${answer.model}, workload ${answer.workload}: cost against per-user speed`,
    axisX: "output tokens per second per user", axisY: "USD per million output tokens", formatX: v => v.toFixed(0), formatY: v => `$${v}`});
}

function download(name, text, type) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([text], {type}));
  link.download = name;
  document.body.appendChild(link);
  link.click();
  setTimeout(() => { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
}

async function exportPlan(format) {
  if (!state.plan) throw new Error("solve a problem first");
  const answer = await api("POST", "/v1/export", {plan: state.plan, format});
  download(answer.filename, answer.text, format === "json" ? "application/json" : "text/plain");
}

// Sweeps: submit a sweep document, poll its job until it ends, then show its summary and table.
function sweepDefault() {
  const base = state.name || "llama-3.1-70b-hgx-h100";
  return JSON.stringify({name: "generations", base, racks: ["hgx-h100", "hgx-b200", "gb200-nvl72"], time_limit_s: 5}, null, 2);
}

async function runSweep() {
  let doc;
  try { doc = JSON.parse($("sweep-doc").value); } catch (e) { throw new Error(`invalid input:\n  - sweep: not valid JSON: ${e.message}\n    fix: correct the document`); }
  const job = await api("POST", "/v1/sweeps", doc);
  state.sweep = job;
  $("cancel-sweep").disabled = false; $("download-sweep").disabled = true;
  $("sweep-summary").replaceChildren(); $("sweep-table").tHead.replaceChildren(); $("sweep-table").tBodies[0].replaceChildren();
  let record = job;
  while (!["done", "failed", "cancelled"].includes(record.status)) {
    $("sweep-progress").textContent = `${record.status}: ${record.points_done} of ${record.points} points`;
    await new Promise(resolve => setTimeout(resolve, 500));
    record = await api("GET", job.progress);
  }
  $("cancel-sweep").disabled = true;
  $("sweep-progress").textContent = `${record.status}: ${record.points_done} of ${record.points} points`;
  if (record.status === "failed") throw new Error(record.error);
  $("sweep-summary").replaceChildren(...(record.summary || []).map(line => { const li = document.createElement("li"); li.textContent = line; return li; }));
  const table = await api("GET", job.table);
  const axes = table.columns.slice(2, table.columns.indexOf("workload"));
  $("sweep-table").tHead.replaceChildren(row(["id", ...axes, "workload", "status", "rack", "$/M out", "TPOT", "TTFT", "accelerators", "plan"], true));
  $("sweep-table").tBodies[0].replaceChildren(...table.rows.map(r => row([r.id, ...axes.map(a => String(r[a])), r.workload || "-", r.status,
    r.rack_id || "-", fmtUsd(r.usd_per_million_output_tokens), fmtSeconds(r.tpot_s), fmtSeconds(r.ttft_s), String(r.accelerators ?? "-"),
    r.layouts || r.reason || ""])));
  $("download-sweep").disabled = false;
}

async function cancelSweep() {
  if (state.sweep) await api("DELETE", state.sweep.progress);
}

async function downloadSweep() {
  if (state.sweep) download(`${state.sweep.name}.csv`, await api("GET", `${state.sweep.table}?format=csv`), "text/csv");
}

function showTab(tab) {
  if (tab === "sweeps" && !$("sweep-doc").value) $("sweep-doc").value = sweepDefault();
  state.tab = tab;
  document.querySelectorAll(".tabs button").forEach(b => b.classList.toggle("active", b.dataset.tab === tab));
  document.querySelectorAll(".panel").forEach(p => { p.hidden = p.id !== `panel-${tab}`; });
  updateUrl();
}

async function loadProblems() {
  state.problems = await api("GET", "/v1/problems");
  $("bundled").replaceChildren(...Object.keys(state.problems).map(name => {
    const b = document.createElement("button");
    b.textContent = name; b.dataset.name = name; b.id = `problem-${name}`;
    b.addEventListener("click", () => choose(name));
    return b;
  }));
}

function wire() {
  $("solve").addEventListener("click", () => busy($("solve"), solve));
  $("run-compare").addEventListener("click", () => busy($("run-compare"), compare));
  $("use-config").addEventListener("click", () => busy($("use-config"), useConfig));
  $("run-frontier").addEventListener("click", () => busy($("run-frontier"), frontier));
  $("run-sweep").addEventListener("click", () => busy($("run-sweep"), runSweep));
  $("cancel-sweep").addEventListener("click", () => cancelSweep().catch(e => showError(e.message)));
  $("download-sweep").addEventListener("click", () => downloadSweep().catch(e => showError(e.message)));
  $("colour-by").addEventListener("change", () => drawPlacement().catch(e => showError(e.message)));
  document.querySelectorAll(".tabs button").forEach(b => b.addEventListener("click", () => showTab(b.dataset.tab)));
  document.querySelectorAll("[data-export]").forEach(b => b.addEventListener("click", () => busy(b, () => exportPlan(b.dataset.export))));
  $("download-plan").addEventListener("click", () => state.plan ? download("plan.json", JSON.stringify(state.plan, null, 2), "application/json") : showError("solve a problem first"));
  $("problem-doc").addEventListener("input", () => { updateUrl(); });
  QUICK.forEach(([id, , write]) => $(id).addEventListener("change", () => applyQuick(id, write)));
  $("token").value = sessionStorage.getItem("planner-token") || "";
  $("token").addEventListener("change", () => {
    sessionStorage.setItem("planner-token", $("token").value);
    showError("");
    question().catch(e => showError(e.message));
  });
}

// the question the address asks (?problem=NAME or #doc=...), solved at once; else the DeepSeek-V3 problem, not yet solved
async function question() {
  await Promise.all([loadProblems(), loadChoices()]);
  const url = new URL(window.location.href);
  const name = url.searchParams.get("problem");
  if (url.searchParams.get("time_limit")) $("time-limit").value = url.searchParams.get("time_limit");
  if (name && state.problems[name]) choose(name);
  else if (url.hash.startsWith("#doc=")) $("problem-doc").value = JSON.stringify(JSON.parse(decodeURIComponent(escape(atob(url.hash.slice(5))))), null, 2);
  else choose(Object.keys(state.problems).includes("deepseek-v3-gb200-nvl72") ? "deepseek-v3-gb200-nvl72" : Object.keys(state.problems)[0]);
  if (url.searchParams.get("tab")) showTab(url.searchParams.get("tab"));
  if (name || url.hash.startsWith("#doc=")) await busy($("solve"), solve);
}

async function start() {
  wire();
  try { await question(); } catch (e) { showError(e.message + ($("token").value ? "" : "\n(a server with a token: enter it above)")); }
  document.body.dataset.ready = "true";
}

start();
