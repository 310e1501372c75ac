// The training page: plain DOM code over the JSON of /dagtrain/api (see app.py).
"use strict";
const q = new URLSearchParams(location.search);
const main = document.getElementById("main");
// Markup is made one way only: html`…`, whose every ${value} is escaped unless it is
// itself html`…` (or a list of them). No value from the server (a metric, a run id, a
// rank's last lines: text a task, a rank or an XCom wrote) is ever read as markup.
class Html { constructor(s) { this.s = s; } toString() { return this.s; } }
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const part = (v) => (v instanceof Html ? v.s : Array.isArray(v) ? v.map(part).join("") : esc(v));
const html = (strings, ...values) => new Html(strings.reduce((out, s, i) => out + s + (i < values.length ? part(values[i]) : ""), ""));
const joined = (items, sep) => items.map((x, i) => (i ? [sep, x] : x));
// a number to d places; what is not a number is shown as the text it is (escaped, as all)
const num = (v, d = 4) => (typeof v === "number" ? v.toFixed(d) : v ?? "");
const pct = (v) => (typeof v === "number" ? `${(100 * v).toFixed(0)}%` : "");
const link = (p) => `?${new URLSearchParams(p)}`;
const bytes = (b) => (b >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MB` : `${(b / 1024).toFixed(1)} KB`);
const stateCls = (s) => (s === "failed" || s === "upstream_failed" ? "bad" : s === "success" || s === "done" ? "good" : "");
const howOf = (how) => String(how ?? "").replace(/^rank \d+ /, "");  // "rank 1 was killed by SIGKILL"
const said = (key) => String(key).replace(/_/g, " ");  // test_mse: "test mse"
// The objective's metrics an epoch row reports (its train_<m> keys), as the server's
// report.metrics_of: the loss first; a row from before objectives: its accuracy, loss.
function metricsOf(epochs) {
  const names = [];
  for (const e of epochs.slice().reverse()) {
    for (const k of Object.keys(e)) if (k.startsWith("train_") && !names.includes(k.slice(6))) names.push(k.slice(6));
    for (const m of ["accuracy", "loss"]) if (!names.includes(m) && (`val_${m}` in e || `test_${m}` in e)) names.push(m);
  }
  return [...names.filter((m) => m === "loss"), ...names.filter((m) => m !== "loss")];
}
// The held-out split of the rows: val (eval_data's), else test (a run without it).
const heldOf = (epochs) => (epochs.some((e) => Object.keys(e).some((k) => k.startsWith("val_"))) ? "val" : "test");
const COLOURS = ["#0b69a3", "#c8571e", "#0e7c3a", "#7b3fbf", "#b8860b", "#52606d"];

async function get(path) {
  const r = await fetch(path, { credentials: "same-origin" });
  if (!r.ok) throw new Error(`${r.status} ${(await r.json().catch(() => ({}))).detail ?? r.statusText}`);
  return r.json();
}

// A table in a box of its own that scrolls sideways when the window is narrower. Each
// cell is a value (shown as text) or html`…`.
function table(head, rows, cls = "") {
  return html`<div class="scroll"><table class="${cls}"><tr>${head.map((h) => html`<th>${h}</th>`)}</tr>${rows
    .map((r) => html`<tr>${r.map((c) => html`<td>${c}</td>`)}</tr>`)}</table></div>`;
}

// The y axis as wide as its longest tick label (a regression's 20,000 is not cut), as
// uPlot's demos size it; never narrower than an earlier cycle made it (finer ticks,
// 3.25 after 3.5, come on a later cycle), so the sizes converge.
function axisWidth(u, values, i, cycle) {
  const axis = u.axes[i];
  const longest = (values ?? []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
  u.ctx.font = axis.font[0];
  const w = Math.ceil(axis.ticks.size + axis.gap + (longest ? u.ctx.measureText(longest).width / devicePixelRatio : 0));
  return cycle > 1 ? Math.max(axis._size ?? 0, w) : w;
}

// One chart: `lines` are [label, epochs, key, {dash, width, colour, scale, marker}]; x is
// the epoch (from 1). A line on scale "share" (a fraction: the clipped steps') is read on
// a right-hand axis in percent; a marker is a point alone (the best epoch), no line.
// `fmt` writes the left axis's ticks and the legend's values (an LR: 3.2e-3).
function chart(el, title, lines, fmt = null) {
  lines = lines.filter(([, epochs, key]) => epochs.some((e) => typeof e[key] === "number"));
  const n = Math.max(0, ...lines.map(([, epochs]) => Math.max(0, ...epochs.map((e) => e.epoch + 1))));
  if (!n) return;
  const xs = Array.from({ length: n }, (_, i) => i + 1);
  const data = [xs, ...lines.map(([, epochs, key]) => xs.map((x) => epochs.find((e) => e.epoch + 1 === x)?.[key] ?? null))];
  const share = lines.some(([, , , o]) => o.scale === "share");
  const shown = (f) => (u, v) => (v == null ? "--" : f(v));
  window.dagtrainCharts.push(new uPlot({
    title, width: 460, height: 260,
    scales: { x: { time: false }, ...(share ? { share: { range: [0, 1] } } : {}) },
    series: [{ label: "epoch" }, ...lines.map(([label, , , o], i) => {
      const stroke = o.colour ?? COLOURS[i % COLOURS.length];
      return {
        label, stroke, width: o.width ?? 2, dash: o.dash, scale: o.scale ?? "y", spanGaps: !o.marker,
        points: o.marker ? { show: true, size: 12, width: 3, stroke, fill: "#fff" } : { show: true, size: o.dash ? 4 : 6 },
        ...(o.scale === "share" ? { value: shown(pct) } : fmt ? { value: shown(fmt) } : {}),
      };
    })],
    // whole epochs on the x axis (no 1.5); the y axis as wide as its labels
    axes: [
      { label: "epoch", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] },
      { size: axisWidth, ...(fmt ? { values: (u, ticks) => ticks.map(fmt) } : {}) },
      ...(share ? [{ scale: "share", side: 1, grid: { show: false }, size: axisWidth, values: (u, ticks) => ticks.map(pct) }] : []),
    ],
  }, data, el));
}

// A learning rate as the epoch lines write it: two significant figures (3.2e-3), 0 as such.
const lrOf = (v) => (typeof v !== "number" ? "" : v === 0 ? "0" : v.toExponential(1).replace("e+", "e"));

// Where the weights training started from came from (a training summary's or a registry
// lineage's init: kind scratch | champion | file, version, path, note), in a few words.
function initText(init) {
  if (!init?.kind) return "";
  if (init.kind === "champion") return `started from champion v${init.version}`;
  if (init.kind === "file") return `started from the model file ${String(init.path ?? "").split("/").pop()}`;
  return init.note ? "no champion yet: trained from scratch" : "trained from scratch";
}

// The Result panel's warm start: the champion (or file) training started from, or that
// there was none yet to start from; its note (what the train task logged) on hover.
function initView(init) {
  const text = initText(init);
  if (!text) return "";
  const warn = init.kind === "scratch" && init.note;
  return html`<p class="init" title="${init.note ?? init.path ?? ""}">${warn ? html`<span class="warn">no champion yet</span>: trained from scratch` : init.kind === "scratch" ? html`<span class="muted">${text}</span>` : text}${
    init.kind !== "scratch" && init.path ? html` <span class="muted">(<code>${init.path}</code>)</span>` : ""}</p>`;
}

// The Result panel's early stop (result.early_stop): where training stopped and why, and
// the epoch whose model is kept (the best, by the watched metric; numbered from 1 here
// as in the charts and the epoch lines, from 0 in the record).
function earlyStopView(es, last) {
  if (!es) return "";
  const m = said(es.metric ?? "");
  const kept = es.best_epoch != null
    ? html`best epoch <b>${es.best_epoch + 1}</b> (${m} ${num(es.best)})${es.best_epoch === last ? ", the last," : ""} is the model kept`
    : html`no epoch had a finite ${m}: the last epoch's model is kept`;
  return es.stopped_after_epoch != null
    ? html`<p class="early-stop"><span class="warn">stopped early</span> after epoch ${es.stopped_after_epoch + 1}: ${es.why}; ${kept}</p>`
    : html`<p class="early-stop">early stopping on ${m} (patience ${es.patience}, min_delta ${es.min_delta}) did not stop training: it ran to the last step; ${kept}</p>`;
}

async function pipelines() {
  const list = await get("api/pipelines");
  main.innerHTML = html`<h1>Training pipelines</h1>${list.length ? table(
    ["pipeline", "description", "recent runs"],
    list.map((p) => [
      html`<a href="${link({ dag_id: p.dag_id })}">${p.dag_id}</a>`, p.description,
      joined(p.runs.map((r) => html`<a href="${link({ dag_id: p.dag_id, run_id: r.run_id })}">${r.run_id}</a> <span class="${stateCls(r.state)}">${r.state}</span>`), html`<br>`),
    ])) : html`<p class="muted">No dagtrain pipeline you may read.</p>`}`;
}

async function pipeline(dagId) {
  const d = `api/dags/${encodeURIComponent(dagId)}`;
  const [runs, reg] = await Promise.all([get(`${d}/runs`), get(`${d}/registry`)]);
  main.innerHTML = html`<p><a href="?">all pipelines</a></p><h1>${dagId}</h1><h2>Runs</h2>${
    table(["run", "state", "started", "ended"], runs.map((r) => [
      html`<a href="${link({ dag_id: dagId, run_id: r.run_id })}">${r.run_id}</a>`, html`<span class="${stateCls(r.state)}">${r.state}</span>`, r.start, r.end]))}${
    registry(reg)}`;
}

function registry(reg) {
  const lineage = (l) => l ? html`<details><summary>run ${l.run_id}</summary>${table(["", ""], [
    ["data version", l.data_version], ["data manifest", html`<code>${l.data_manifest}</code>`],
    ["config", html`<code>${l.config}</code>`], ...(l.init?.kind ? [["initial weights", initText(l.init)]] : []),
    ...["model", "training", "distributed"].filter((s) => l.config_values?.[s]).map((s) => [s, html`<code>${JSON.stringify(l.config_values[s])}</code>`]),
  ])}</details>` : "";
  const mv = (v) => { const m = reg.mlflow?.[String(v.version)]; return m ? html` <a class="mlflow" href="${m.url}" target="_blank" rel="noopener">MLflow ${m.name} v${m.version}</a>` : ""; };
  // the server's columns: the metric the pipeline promotes on, then the test loss
  const columns = reg.columns ?? ["test_accuracy", "test_loss"];
  return html`<h2 id="registry">Model registry</h2>${reg.versions.length ? table(
    ["version", ...columns.map(said), "promoted", "why", "lineage"],
    reg.versions.slice().reverse().map((v) => [
      html`v${v.version} ${v.version === reg.champion ? html`<span class="badge">champion</span>` : ""}${mv(v)}`,
      ...columns.map((c) => html`<span class="num">${num(v.metrics?.[c])}</span>`),
      v.promoted ? html`<span class="good">yes</span>` : html`<span class="bad">no</span>`, v.reason, lineage(v.lineage),
    ]), "registry") : html`<p class="muted">No model registered yet.</p>`}`;
}

function diff(rows, other) {
  return rows.length ? table(["field", "this run", other], rows.map((d) => [d.field, html`<code>${JSON.stringify(d.run)}</code>`, html`<code>${JSON.stringify(d.other)}</code>`]))
    : html`<p class="muted">Same as the ${other}.</p>`;
}

// Every rank's trace of one step: a lane per worker thread per rank, a bar per op, the
// critical path (args.critical, from the server) outlined in black.
function timeline(trace) {
  const spans = trace.traceEvents.filter((e) => e.ph === "X");
  if (!spans.length) return html`<p class="muted">No step trace (executor.trace is off, or the run did not get that far).</p>`;
  if (isPipelined(trace, spans)) return pipelineTimeline(trace, spans);
  const names = {};
  for (const e of trace.traceEvents) if (e.ph === "M" && e.name === "thread_name") names[`${e.pid}:${e.tid}`] = e.args.name;
  const lanes = [...new Set([...Object.keys(names), ...spans.map((e) => `${e.pid}:${e.tid}`)])].sort((a, b) => a.split(":")[0] - b.split(":")[0] || a.split(":")[1] - b.split(":")[1]);
  const t0 = Math.min(...spans.map((e) => e.ts)), t1 = Math.max(...spans.map((e) => e.ts + e.dur));
  const W = 960, L = 130, H = 20, scale = (W - L - 4) / Math.max(t1 - t0, 1);
  const colour = (n) => n.startsWith("allreduce") ? "#c8571e" : n.startsWith("update") ? "#0e7c3a" : n.startsWith("forward") ? "#0b69a3" : n.startsWith("bucket") ? "#e0a96d" : "#9aa5b1";
  const rects = spans.map((e) => {
    const y = lanes.indexOf(`${e.pid}:${e.tid}`) * H, crit = e.args?.critical;
    return html`<rect class="op${crit ? " critical" : ""}" x="${L + (e.ts - t0) * scale}" y="${y + 3}" width="${Math.max(e.dur * scale, 1)}" height="${H - 6}" fill="${colour(String(e.name))}"${crit ? html` stroke="#111" stroke-width="2"` : ""}><title>rank ${e.pid} · ${e.name}: ${(e.dur / 1000).toFixed(2)} ms${crit ? " (critical path)" : ""}</title></rect>`;
  });
  const labels = lanes.map((l, i) => { const [p, t] = l.split(":"); return html`<text class="lane" x="0" y="${i * H + 14}">rank ${p} · ${names[l] ?? `thread ${t}`}</text>`; });
  const seps = lanes.map((l, i) => i && l.split(":")[0] !== lanes[i - 1].split(":")[0] ? html`<line x1="0" x2="${W}" y1="${i * H}" y2="${i * H}" stroke="#cbd2d9"/>` : "");
  return html`<div class="scroll"><svg class="timeline" width="${W}" height="${lanes.length * H}" data-lanes="${lanes.length}" data-ranks="${new Set(spans.map((e) => e.pid)).size}">${seps}${labels}${rects}</svg></div>
    <p class="muted">${((t1 - t0) / 1000).toFixed(1)} ms. <span style="color:#0b69a3">■</span> forward/backward <span style="color:#e0a96d">■</span> bucket ready <span style="color:#c8571e">■</span> allreduce <span style="color:#0e7c3a">■</span> update <span style="color:#9aa5b1">■</span> other (prefetch, snapshot); outlined: the critical path.</p>`;
}

// A pipelined step's ops, as the server tells them in each span's args (the names are
// the server's to read, dagtrain.records.trace): args.op F forward, B backward (input
// gradient), W weight gradient, send-/recv-act and send-/recv-grad between stages
// (args.way: send or recv), args.microbatch; the rest allreduce[k] between replicas,
// update, load-next.
const PIPE_COLOURS = { F: "#0b69a3", B: "#c8571e", W: "#0e7c3a", send: "#7b3fbf", recv: "#b794e6", allreduce: "#4c2a85", update: "#b8860b", other: "#9aa5b1" };
function pipeOp(e) {
  const a = e.args ?? {}, name = String(e.name);
  if (a.op != null) return { kind: a.way ?? a.op, mb: a.microbatch == null ? null : `${a.microbatch}${a.chunk == null ? "" : `.${a.chunk}`}` };
  return { kind: name.startsWith("allreduce") ? "allreduce" : name.startsWith("update") ? "update" : "other" };
}
const isPipelined = (trace, spans) => trace.otherData?.pipeline != null || spans.some((e) => e.args?.op != null);

// A pipelined step: a lane per stage rank (a row per thread it ran ops on), ordered by
// replica and stage; each bar labelled by its microbatch; each rank's bubble (the
// server's, otherData.pipeline) at the lane's end, their mean and (S-1)/(M+S-1) below.
function pipelineTimeline(trace, spans) {
  const p = trace.otherData?.pipeline ?? { ranks: [] };
  const info = Object.fromEntries(p.ranks.map((x) => [x.rank, x]));
  const names = {};
  for (const e of trace.traceEvents) if (e.ph === "M" && e.name === "thread_name") names[`${e.pid}:${e.tid}`] = e.args.name;
  const key = (l) => { const [pid, tid] = l.split(":").map(Number), x = info[pid] ?? {}; return [x.replica ?? 0, x.stage ?? pid, pid, tid]; };
  const cmp = (a, b) => { const ka = key(a), kb = key(b); for (let i = 0; i < ka.length; i++) if (ka[i] !== kb[i]) return ka[i] - kb[i]; return 0; };
  const lanes = [...new Set(spans.map((e) => `${e.pid}:${e.tid}`))].sort(cmp);
  const t0 = Math.min(...spans.map((e) => e.ts)), t1 = Math.max(...spans.map((e) => e.ts + e.dur));
  const W = 960, L = 130, R = 84, H = 22, scale = (W - L - R - 4) / Math.max(t1 - t0, 1);
  const first = (l, i) => !i || l.split(":")[0] !== lanes[i - 1].split(":")[0];
  const rankLabel = (pid) => `rank ${pid}${info[pid]?.stage != null ? ` · stage ${info[pid].stage}` : ""}`;
  const bars = spans.map((e) => {
    const y = lanes.indexOf(`${e.pid}:${e.tid}`) * H, crit = e.args?.critical, op = pipeOp(e);
    const x = L + (e.ts - t0) * scale, w = Math.max(e.dur * scale, 1);
    const fits = (t) => w >= t.length * 6 + 2;  // 10px digits are about 6px wide
    const text = op.mb == null ? "" : "FBW".includes(op.kind) && fits(e.name) ? e.name : fits(op.mb) ? op.mb : "";
    return html`<g class="op ${op.kind}${crit ? " critical" : ""}" data-name="${e.name}"${op.mb != null ? html` data-microbatch="${op.mb}"` : ""}><rect x="${x}" y="${y + 3}" width="${w}" height="${H - 6}" fill="${PIPE_COLOURS[op.kind]}"${crit ? html` stroke="#111" stroke-width="2"` : ""}><title>${rankLabel(e.pid)} · ${e.name}: ${(e.dur / 1000).toFixed(2)} ms${crit ? " (critical path)" : ""}</title></rect>${text ? html`<text class="mb${op.kind === "recv" ? " dark" : ""}" x="${x + w / 2}" y="${y + H / 2 + 4}">${text}</text>` : ""}</g>`;
  });
  const labels = lanes.map((l, i) => {
    const [pid, tid] = l.split(":");
    if (!first(l, i)) return html`<text class="lane sub" x="12" y="${i * H + 15}">${names[l] ?? `thread ${tid}`}</text>`;
    const b = info[pid]?.bubble;
    return html`<text class="lane rank" x="0" y="${i * H + 15}">${rankLabel(pid)}</text>${
      b != null ? html`<text class="lane bubble" x="${W - R + 6}" y="${i * H + 15}">bubble ${pct(b)}</text>` : ""}`;
  });
  const seps = lanes.map((l, i) => i && first(l, i) ? html`<line x1="0" x2="${W}" y1="${i * H}" y2="${i * H}" stroke="#cbd2d9"/>` : "");
  const sw = (k, what) => html`<span class="swatch" style="background:${PIPE_COLOURS[k]}"></span>${what}`;
  const S = p.stages, M = p.microbatches, v = p.chunks ?? 1;
  const formula = p.reference_bubble == null ? "" : v > 1
    ? html` · for reference, (S−1)/(vM+S−1) = (${S}−1)/(${v}·${M}+${S}−1) = <b>${pct(p.reference_bubble)}</b>, the interleaved orders' bubble in theory`
    : html` · for reference, (S−1)/(M+S−1) = (${S}−1)/(${M}+${S}−1) = <b>${pct(p.reference_bubble)}</b>, ${p.order === "zero-bubble" ? "1F1B's and GPipe's bubble (zero-bubble aims below it)" : `${p.order}'s bubble in theory`}`;
  const mean = p.mean_bubble != null
    ? html`<p class="bubble-summary">bubble, this step: ${joined(p.ranks.filter((x) => x.bubble != null).map((x) => `${rankLabel(x.rank)} ${pct(x.bubble)}`), ", ")}; mean <b>${pct(p.mean_bubble)}</b>${formula}${p.reported_bubble != null ? ` · rank 0's own figure in the result: ${pct(p.reported_bubble)}` : ""}.<br><span class="muted">measured per stage rank: 1 − (time its F, B and W ops ran) ÷ (its step: first op's start to last op's end)</span></p>` : "";
  return html`<div class="scroll"><svg class="timeline pipelined" width="${W}" height="${lanes.length * H}" data-lanes="${lanes.length}" data-ranks="${new Set(spans.map((e) => e.pid)).size}">${seps}${labels}${bars}</svg></div>
    <p class="legend muted">${((t1 - t0) / 1000).toFixed(1)} ms. ${sw("F", "F forward")} ${sw("B", "B backward (its input gradient, where W follows)")} ${sw("W", "W weight gradient")} ${sw("send", "send")} ${sw("recv", "recv")} (activations and gradients between stages) ${sw("allreduce", "allreduce")} ${sw("update", "update")} ${sw("other", "other (load-next)")}; the number on a bar is its microbatch${v > 1 ? " (m.j: through the rank's chunk j)" : ""}; outlined: the critical path.</p>${mean}`;
}

// A pipelined run's ranks (their records say their stage) get a stage and a replica column.
// An elastic run's ranks that a shrink lost come last, "left at step S", numbered as the
// world they left numbered them; a record an earlier world wrote is marked so.
function ranksTable(ranks) {
  if (!ranks.length) return html`<p class="muted">No rank has reported yet.</p>`;
  const staged = ranks.some((k) => k.stage != null);
  const status = (k) => k.status === "left"
    ? html`<span class="warn">left</span>${k.left_at_step != null ? ` at step ${k.left_at_step}` : ""}${k.back_at_step != null ? html`<br><span class="muted">its host back at step ${k.back_at_step}</span>` : ""}`
    : html`<span class="${stateCls(k.status)}">${k.status}</span>${k.earlier_world ? html` <span class="muted">(an earlier world's record)</span>` : ""}`;
  return table(["rank", ...(staged ? ["stage", "replica"] : []), "host", "status", "step", "samples/s", "median step (ms)", "p95 step (ms)", "exit", "how", "last lines"], ranks.map((k) => [
    html`${k.rank}${k.slowest ? html` <span class="warn">slowest</span>` : ""}${k.left_world != null ? html` <span class="muted" title="as the world of ${k.left_world} ranks it left numbered it">of ${k.left_world}</span>` : ""}`,
    ...(staged ? [k.stage, k.replica] : []), k.host, status(k),
    k.step == null ? "" : `${k.step}${k.total_steps ? ` / ${k.total_steps}` : ""}`,
    html`<span class="num">${num(k.samples_per_second, 0)}</span>`, html`<span class="num">${num(k.median_step_ms, 1)}</span>`, html`<span class="num">${num(k.p95_step_ms, 1)}</span>`,
    k.signal ?? k.exit_code, k.how ? html`<div class="prose">${howOf(k.how)}</div>` : "", k.last_lines?.length ? html`<pre>${k.last_lines.join("\n")}</pre>` : "",
  ]), "ranks");
}

// An elastic run's changes of world (its metrics' world lines, each try's): where the
// new world started, its size (a restart: the same slots, new processes), the ranks
// and hosts lost or taken back, the seconds from
// the loss to the new world's first step, the steps trained again, why.
function worldTable(changes) {
  const plural = (v, w) => `${v} ${w}${v === 1 ? "" : "s"}`;
  return table(["try", "at step", "world", "ranks lost", "hosts", "recovered in", "steps lost", "why"], changes.map((c) => [
    c.try, html`<span class="num">${c.step ?? "?"}</span>`,
    html`${c.from} → ${plural(c.to, "rank")} <span class="${c.change === "grow" ? "good" : "warn"}">${c.change}</span>`,
    c.ranks?.length ? c.ranks.join(", ") : html`<span class="muted">none</span>`,
    c.hosts?.length ? html`${c.hosts.join(", ")} <span class="muted">${{ grow: "back", restart: "its slots used again" }[c.change] ?? "lost"}</span>` : "",
    c.seconds != null ? html`<span class="num">${num(c.seconds, 1)} s</span>` : html`<span class="muted">unknown</span>`,
    html`<span class="num">${c.steps_lost ?? ""}</span>`, html`<div class="prose" title="${c.line}">${c.why}</div>`,
  ]), "world");
}

// One try's failure (failure-try<N>.json): the rank and how it ended, or, before any
// rank failed, the error; bad input is not retried.
function failureOf(f) {
  const what = f.rank != null ? `rank ${f.rank} ${howOf(f.how)}` : f.how ?? f.error ?? "failed";
  const why = f.error && f.rank != null && !String(f.how ?? "").includes(f.error) ? html`<br><span class="muted">${f.error}</span>` : "";
  return html`<span class="bad">${what}</span>${f.bad_input ? " (bad input: not retried)" : ""}${why}`;
}

// result.json's pipeline: S stages x D replicas, M microbatches, the order, the split
// (the first block of each stage after the first) and the blocks each stage got.
function pipelineSummary(p) {
  if (!p) return "";
  const n = Array.isArray(p.blocks) ? p.blocks.length : typeof p.blocks === "number" ? p.blocks : null;
  const edges = Array.isArray(p.split) && n ? [0, ...p.split, n] : null;
  const ranges = edges ? ` (blocks ${edges.slice(1).map((b, i) => (b - 1 > edges[i] ? `${edges[i]}–${b - 1}` : `${edges[i]}`)).join(" | ")})` : "";
  const plural = (v, w) => `${v} ${w}${v === 1 ? "" : "s"}`;
  return html`<p class="pipeline"><b>pipeline</b>: ${plural(p.stages, "stage")} × ${plural(p.replicas, "replica")}, ${plural(p.microbatches, "microbatch").replace(/hs$/, "hes")}, ${p.chunks > 1 ? `${p.chunks} chunks a rank (${p.placement === "v" ? "in a V" : "looped"}${Array.isArray(p.parts) ? `: rank 0 runs parts ${p.parts.join(", ")}` : ""}), ` : ""}order ${p.order}${p.order_trial ? ` (auto: ${p.order_trial.why})` : ""}, split ${JSON.stringify(p.split)}${ranges}${
    typeof p.peak_activation_bytes === "number" ? ` · peak activations ${bytes(p.peak_activation_bytes)}${p.stage != null ? ` (stage ${p.stage})` : ""}` : ""}</p>`;
}

// Each round's shards and global model, by the objective's first metric (r.metric:
// accuracy, mse, perplexity, ...) on the validation split.
function roundsView(rounds) {
  return rounds.map((r) => { const m = r.metric ?? "accuracy"; return html`<h3>Round ${r.round} <span class="muted">sync: ${r.sync_state ?? "not yet"}</span></h3>${
    table(["shard", "task", "contribution", "steps", "samples/s", `validation ${said(m)}`], r.shards.map((s) => [
      s.shard, html`<span class="${stateCls(s.state)}">${s.state}</span>`, s.contributed ? html`<span class="good">written</span>` : html`<span class="muted">none</span>`,
      s.steps, html`<span class="num">${num(s.samples_per_second, 0)}</span>`, html`<span class="num">${num(s.val ?? s.val_accuracy)}</span>`]))}${
    r.global ? html`<p>global model after round ${r.round}: validation ${said(m)} <b>${num(r.global.metrics?.[`val_${m}`])}</b>${m !== "loss" ? `, loss ${num(r.global.metrics?.val_loss)}` : ""}, |pseudo-gradient| ${num(r.global.pseudo_gradient_norm)}</p>` : ""}`; });
}

async function run(dagId, runId) {
  const d = `api/dags/${encodeURIComponent(dagId)}`, base = `${d}/runs/${encodeURIComponent(runId)}`;
  const step = q.get("step");
  const traceUrl = `${base}/trace${step ? `?step=${encodeURIComponent(step)}` : ""}`;
  const [r, reg, trace, curves] = await Promise.all([get(base), get(`${d}/registry`), get(traceUrl).catch(() => ({ traceEvents: [] })), get(`${d}/curves`).catch(() => [])]);
  const ev = r.evaluation, res = r.result;
  // the objective's metrics (the loss first), its first but the loss, the promotion metric
  const metrics = r.metrics ?? metricsOf(r.epochs), first = metrics.find((m) => m !== "loss") ?? "loss";
  const promo = r.promotion_metric ?? "test_accuracy", lastRow = r.epochs.at(-1) ?? {};
  // with early stopping the best epoch's model is the run's: its row, not the last one
  const es = res?.early_stop, best = es?.best_epoch;
  const keptRow = (best != null && r.epochs.find((e) => e.epoch === best)) || lastRow;
  const failed = r.ranks.filter((k) => k.status === "failed");
  const changes = r.world_changes ?? [];
  const steps = r.trace_steps.map((s) => html`<option value="${s.step ?? ""}"${String(s.step ?? "") === (step ?? "") ? html` selected` : ""}>${s.label}</option>`);
  const assets = r.asset_events?.length ? joined(r.asset_events.map((a) => html`<a href="/assets/${encodeURIComponent(a.asset_id)}">${a.name}</a> <span class="muted">(${a.task_id}, ${a.timestamp})</span>`), html`<br>`) : "";
  main.innerHTML = html`<p><a href="?">all pipelines</a> · <a href="${link({ dag_id: dagId })}">${dagId}</a></p>
    <h1>${dagId} <span class="muted">${runId}</span></h1>
    ${failed.length ? html`<p class="bad failure">rank ${joined(failed.map((k) => `${k.rank}${k.host ? ` on ${k.host}` : ""} ${howOf(k.how)}`), "; ")}</p>` : ""}
    <h2>Stages</h2>${table(["stage", "state", "try", "seconds"], r.stages.map((s) => [s.task_id + (s.map_index >= 0 ? `[${s.map_index}]` : ""), html`<span class="${stateCls(s.state)}">${s.state}</span>`, s.try_number, html`<span class="num">${num(s.duration, 1)}</span>`]))}
    <h2>Curves</h2><div class="charts" id="charts"></div>
    ${r.epochs.length ? (curves.length > 1 ? html`<p class="muted">dashed: validation of the pipeline's ${curves.length - 1} other newest run(s), for comparison</p>` : "") : html`<p class="muted">No epoch has ended yet.</p>`}
    <h2>Result</h2>${res ? table([`validation ${said(first)}${keptRow !== lastRow ? ` (epoch ${keptRow.epoch + 1}, kept)` : ""}`, said(promo), "samples/s", "median step (s)", "skipped steps"], [[num(keptRow[`val_${first}`] ?? (first === "accuracy" ? res.val_accuracy : null)), num(ev?.metrics?.[promo]), num(res.samples_per_second, 0), num(res.median_step_seconds, 4), res.skipped_steps]]) : html`<p class="muted">No result yet.</p>`}
    ${initView(res?.init)}${earlyStopView(es, lastRow.epoch)}
    ${pipelineSummary(res?.pipeline)}
    ${ev ? html`<p class="verdict">${ev.better ? "promoted" : "not promoted"}: ${ev.reason}</p>` : ""}
    ${r.mlflow ? html`<p class="mlflow">MLflow: <a href="${r.mlflow.url}" target="_blank" rel="noopener">run ${r.mlflow.run_id}</a> in experiment ${r.mlflow.experiment}${r.mlflow.pending ? html` <span class="bad">(some logging is waiting for the server)</span>` : ""}</p>` : ""}
    <h2 id="ranks">Ranks</h2>${ranksTable(r.ranks)}
    ${changes.length ? html`<h2 id="world-changes">World changes</h2>${worldTable(changes)}` : ""}
    <h2>Tries and resumes</h2>${r.tries.length ? table(["try", "resumed from step", "epochs already done", ...(changes.length ? ["world changes"] : []), "failure"], r.tries.map((t) => {
      const f = t.failure, n = t.world_changes?.length ?? 0;
      return [t.try, t.started ? t.resumed_from_step ?? "start" : html`<span class="muted">did not train</span>`, t.epochs_done_before ?? "",
        ...(changes.length ? [n ? html`<a href="#world-changes">${n}</a>` : ""] : []), f ? failureOf(f) : ""];
    })) : html`<p class="muted">Training has not started.</p>`}
    <h2>Gradient sync</h2>${r.sync?.none ? html`<p class="muted">${r.sync.none}.</p>` : r.sync ? html`${table(["buckets", "sizes", "allreduce (ms)", "hidden under backward", "skipped non-finite steps"], [[r.sync.buckets, r.sync.bucket_bytes.map(bytes).join(", "), num(r.sync.allreduce_ms, 2), pct(r.sync.hidden_share), r.sync.skipped_steps]])}${
      r.sync_by_rank.length > 1 ? html`<p class="muted">per rank, last step: ${r.sync_by_rank.map((s) => `rank ${s.rank} ${num(s.allreduce_ms, 2)} ms allreduce, ${pct(s.hidden_share)} hidden`).join("; ")}</p>` : ""}` : html`<p class="muted">No trace.</p>`}
    <h2 id="timeline">Op timeline, every rank</h2>
    <p>${r.trace_steps.length ? html`<label>step <select id="step">${steps}</select></label> · ` : ""}<a href="${traceUrl}" download>download the merged trace</a> <span class="muted">(opens in ui.perfetto.dev)</span></p>${timeline(trace)}
    ${r.rounds.length ? html`<h2>Rounds</h2>${roundsView(r.rounds)}` : ""}
    <h2>Data</h2>${r.data ? table(["version", "rows", "asset events"], [[r.data.version, Object.entries(r.data.rows ?? {}).map(([k, v]) => `${k} ${v}`).join(", "), assets]]) : ""}
    <h2>Effective config <span class="muted">(what the ranks received)</span></h2>${r.config ? html`<pre class="config">${JSON.stringify(r.config, null, 1)}</pre>` : html`<p class="muted">Training has not started.</p>`}
    ${r.config ? html`<h2>Difference from the file</h2>${diff(r.config_vs_file, "file")}
    <h2>Difference from the champion${r.champion ? ` (v${r.champion})` : ""}</h2>${r.champion ? diff(r.config_vs_champion, "champion") : html`<p class="muted">No champion.</p>`}` : ""}
    ${registry(reg)}`;
  document.getElementById("step")?.addEventListener("change", (e) => {
    const p = new URLSearchParams(location.search);
    if (e.target.value) p.set("step", e.target.value); else p.delete("step");
    history.replaceState(null, "", `?${p}`);
    q.set("step", e.target.value); if (!e.target.value) q.delete("step");
    run(dagId, runId);
  });
  const charts = document.getElementById("charts");
  window.dagtrainCharts = [];
  // a chart per metric of the objective (the loss first): train, and the held-out split
  // (validation, or test without eval_data); the other runs' held-out curves dashed
  const others = curves.filter((c) => c.run_id !== runId);
  const held = heldOf(r.epochs), heldName = held === "val" ? "validation" : "test";
  const box = (key) => { const el = document.createElement("div"); el.className = "chart"; el.dataset.metric = key; charts.appendChild(el); return el; };
  const has = (key) => r.epochs.some((e) => typeof e[key] === "number");
  // the best epoch (early stopping's, the model kept) marked on its metric's held-out curve
  const bestRow = best != null ? r.epochs.filter((e) => e.epoch === best) : [];
  for (const m of metrics) {
    const marked = bestRow.length && es.metric === `${held}_${m}`;
    chart(box(m), said(m), [
      ["train", r.epochs, `train_${m}`, {}], [heldName, r.epochs, `${held}_${m}`, {}],
      ...others.map((c) => { const h = heldOf(c.epochs); return [`${c.run_id.slice(0, 28)} (${h})`, c.epochs, `${h}_${m}`, { dash: [6, 4], width: 1 }]; }),
      ...(marked ? [[`best epoch ${best + 1} (kept)`, bestRow, es.metric, { marker: true, colour: "#1f2933" }]] : []),
    ]);
    if (m !== metrics[0]) continue;
    // beside the loss: the LR of each epoch's last step, then (with training.max_grad_norm)
    // the mean gradient norm before clipping, the threshold, and the share of steps clipped
    if (has("lr")) chart(box("lr"), "learning rate", [["LR (epoch's last step)", r.epochs, "lr", { colour: "#7b3fbf" }]], lrOf);
    if (has("grad_norm")) {
      const limit = r.config?.training?.max_grad_norm;
      const line = typeof limit === "number" ? r.epochs.map((e) => ({ epoch: e.epoch, limit })) : [];
      chart(box("grad_norm"), "gradient norm", [
        ["mean norm before clipping", r.epochs, "grad_norm", { colour: "#0b69a3" }],
        [`max_grad_norm ${limit}`, line, "limit", { colour: "#52606d", dash: [4, 4], width: 1 }],
        ["steps clipped (right axis)", r.epochs, "clip_rate", { colour: "#c8571e", scale: "share" }],
      ]);
    }
  }
  if (r.stages.some((s) => ["running", "queued", "scheduled", "up_for_retry", "restarting"].includes(s.state))) setTimeout(() => run(dagId, runId), 3000);
}

(async () => {
  try {
    if (q.get("dag_id") && q.get("run_id")) await run(q.get("dag_id"), q.get("run_id"));
    else if (q.get("dag_id")) await pipeline(q.get("dag_id"));
    else await pipelines();
  } catch (e) {
    main.innerHTML = html`<p class="bad">${e.message}</p>`;
  }
})();
