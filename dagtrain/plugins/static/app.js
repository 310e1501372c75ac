// The training page: plain DOM code over the JSON of /dagtrain/api (see app.py).
"use strict";
const q = new URLSearchParams(location.search);
const main = document.getElementById("main");
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const num = (v, d = 4) => (typeof v === "number" ? v.toFixed(d) : v ?? "");
const link = (p) => `?${new URLSearchParams(p)}`;
const bytes = (b) => (b >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MB` : `${(b / 1024).toFixed(1)} KB`);

async function get(path) {
  const r = await fetch(path, { credentials: "same-origin" });
  if (!r.ok) throw new Error(`${r.status} ${(await r.json().catch(() => ({}))).detail ?? r.statusText}`);
  return r.json();
}

function table(head, rows) {
  return `<table><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}</tr>${rows
    .map((r) => `<tr>${r.map((c) => `<td>${c}</td>`).join("")}</tr>`)
    .join("")}</table>`;
}

function chart(el, title, epochs, series) {
  const xs = epochs.map((e) => e.epoch + 1);
  const cols = series.filter(([key]) => epochs.some((e) => typeof e[key] === "number"));
  if (!xs.length || !cols.length) return;
  const data = [xs, ...cols.map(([key]) => epochs.map((e) => e[key] ?? null))];
  const colours = ["#0b69a3", "#c8571e", "#0e7c3a", "#7b3fbf"];
  window.dagtrainCharts = window.dagtrainCharts || [];  // for the browser test
  window.dagtrainCharts.push(new uPlot({
    title, width: 420, height: 240,
    scales: { x: { time: false } },
    series: [{ label: "epoch" }, ...cols.map(([key, label], i) => ({ label, stroke: colours[i], points: { show: true } }))],
    axes: [{ label: "epoch" }, {}],
  }, data, el));
}

async function pipelines() {
  const list = await get("api/pipelines");
  main.innerHTML = `<h1>Training pipelines</h1>` + (list.length ? table(
    ["pipeline", "description", "recent runs"],
    list.map((p) => [
      `<a href="${link({ dag_id: p.dag_id })}">${esc(p.dag_id)}</a>`, esc(p.description),
      p.runs.map((r) => `<a href="${link({ dag_id: p.dag_id, run_id: r.run_id })}">${esc(r.run_id)}</a> <span class="muted">${esc(r.state)}</span>`).join("<br>"),
    ])) : `<p class="muted">No dagtrain pipeline you may read.</p>`);
}

async function pipeline(dagId) {
  const [runs, reg] = await Promise.all([get(`api/dags/${encodeURIComponent(dagId)}/runs`), get(`api/dags/${encodeURIComponent(dagId)}/registry`)]);
  main.innerHTML = `<p><a href="?">all pipelines</a></p><h1>${esc(dagId)}</h1><h2>Runs</h2>` +
    table(["run", "state", "started", "ended"], runs.map((r) => [
      `<a href="${link({ dag_id: dagId, run_id: r.run_id })}">${esc(r.run_id)}</a>`, esc(r.state), esc(r.start), esc(r.end)])) +
    registry(reg);
}

function registry(reg) {
  return `<h2>Model registry</h2>` + (reg.versions.length ? table(
    ["version", "test accuracy", "test loss", "promoted", "why", "run", "data"],
    reg.versions.map((v) => [
      `v${v.version} ${v.version === reg.champion ? '<span class="badge">champion</span>' : ""}`,
      `<span class="num">${num(v.metrics.test_accuracy)}</span>`, `<span class="num">${num(v.metrics.test_loss)}</span>`,
      v.promoted ? '<span class="good">yes</span>' : "no", esc(v.reason), esc(v.lineage?.run_id), esc(v.lineage?.data_version),
    ])) : `<p class="muted">No model registered yet.</p>`);
}

function diff(rows, other) {
  return rows.length ? table(["field", "this run", other], rows.map((d) => [esc(d.field), `<code>${esc(JSON.stringify(d.run))}</code>`, `<code>${esc(JSON.stringify(d.other))}</code>`]))
    : `<p class="muted">Same as the ${esc(other)}.</p>`;
}

function timeline(trace) {
  const spans = trace.traceEvents.filter((e) => e.ph === "X");
  if (!spans.length) return `<p class="muted">No step trace (executor.trace is off, or the run did not get that far).</p>`;
  const lanes = [...new Set(spans.map((e) => `${e.pid}:${e.tid}`))].sort();
  const t0 = Math.min(...spans.map((e) => e.ts)), t1 = Math.max(...spans.map((e) => e.ts + e.dur));
  const W = 900, L = 110, H = 18, scale = (W - L) / Math.max(t1 - t0, 1);
  const colour = (n) => n.startsWith("allreduce") ? "#c8571e" : n.startsWith("update") ? "#0e7c3a" : n.startsWith("forward") ? "#0b69a3" : "#9aa5b1";
  const rects = spans.map((e) => {
    const y = lanes.indexOf(`${e.pid}:${e.tid}`) * H;
    return `<rect x="${L + (e.ts - t0) * scale}" y="${y + 2}" width="${Math.max(e.dur * scale, 1)}" height="${H - 4}" fill="${colour(e.name)}"><title>${esc(e.name)}: ${(e.dur / 1000).toFixed(2)} ms</title></rect>`;
  }).join("");
  const labels = lanes.map((l, i) => { const [p, t] = l.split(":"); return `<text class="lane" x="0" y="${i * H + 13}">rank ${p} · thread ${t}</text>`; }).join("");
  return `<svg class="timeline" width="${W}" height="${lanes.length * H}" data-lanes="${lanes.length}">${labels}${rects}</svg>
    <p class="muted">${((t1 - t0) / 1000).toFixed(1)} ms; blue: forward/backward, orange: allreduce, green: update.</p>`;
}

async function run(dagId, runId) {
  const base = `api/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(runId)}`;
  const [r, reg, trace] = await Promise.all([get(base), get(`api/dags/${encodeURIComponent(dagId)}/registry`), get(`${base}/trace`).catch(() => ({ traceEvents: [] }))]);
  const ev = r.evaluation, res = r.result;
  main.innerHTML = `<p><a href="?">all pipelines</a> · <a href="${link({ dag_id: dagId })}">${esc(dagId)}</a></p>
    <h1>${esc(dagId)} <span class="muted">${esc(runId)}</span></h1>
    <h2>Stages</h2>${table(["stage", "state", "try", "seconds"], r.stages.map((s) => [esc(s.task_id + (s.map_index >= 0 ? `[${s.map_index}]` : "")), `<span class="${s.state === "failed" ? "bad" : ""}">${esc(s.state)}</span>`, esc(s.try_number), `<span class="num">${num(s.duration, 1)}</span>`]))}
    <h2>Curves</h2><div class="charts" id="charts"></div>
    ${r.epochs.length ? "" : '<p class="muted">No epoch has ended yet.</p>'}
    <h2>Result</h2>${res ? table(["validation accuracy", "test accuracy", "samples/s", "median step (s)", "skipped steps"], [[num(res.val_accuracy), num(ev?.metrics?.test_accuracy), num(res.samples_per_second, 0), num(res.median_step_seconds, 4), esc(res.skipped_steps)]]) : '<p class="muted">No result yet.</p>'}
    ${ev ? `<p>evaluation: ${esc(ev.reason)}${ev.better ? "" : " (not promoted)"}</p>` : ""}
    <h2>Ranks</h2>${table(["rank", "status", "last traced step (ms)", "how", "last lines"], r.ranks.map((k) => [esc(k.rank) + (k.slowest ? ' <span class="muted">(slowest)</span>' : ""), `<span class="${k.status === "failed" ? "bad" : ""}">${esc(k.status)}</span>`, `<span class="num">${num(k.last_step_ms, 1)}</span>`, esc(k.how), k.last_lines.length ? `<pre>${esc(k.last_lines.join("\n"))}</pre>` : ""]))}
    <h2>Tries and resumes</h2>${r.tries.length ? table(["try", "resumed from step"], r.tries.map((t) => [esc(t.try), esc(t.resumed_from_step ?? "start")])) : '<p class="muted">Training has not started.</p>'}
    <h2>Gradient sync (rank 0, last step)</h2>${r.sync ? table(["buckets", "sizes", "allreduce (ms)", "hidden under backward", "skipped non-finite steps"], [[esc(r.sync.buckets), esc(r.sync.bucket_bytes.map(bytes).join(", ")), num(r.sync.allreduce_ms, 2), r.sync.hidden_share == null ? "" : `${(100 * r.sync.hidden_share).toFixed(0)}%`, esc(r.sync.skipped_steps)]]) : '<p class="muted">No trace.</p>'}
    <h2>Op timeline (last step, every rank) <a href="${base}/trace" download>download for Perfetto</a></h2>${timeline(trace)}
    <h2>Data</h2>${r.data ? table(["version", "rows"], [[esc(r.data.version), esc(JSON.stringify(r.data.rows))]]) : ""}
    <h2>Effective config</h2><pre>${esc(JSON.stringify(r.config, null, 1))}</pre>
    <h2>Difference from the file</h2>${diff(r.config_vs_file, "file")}
    <h2>Difference from the champion${r.champion ? ` (v${r.champion})` : ""}</h2>${r.champion ? diff(r.config_vs_champion, "champion") : '<p class="muted">No champion.</p>'}
    ${registry(reg)}`;
  const charts = document.getElementById("charts");
  window.dagtrainCharts = [];
  for (const [title, s] of [["loss", [["train_loss", "train"], ["val_loss", "validation"]]], ["accuracy", [["train_accuracy", "train"], ["val_accuracy", "validation"]]]]) {
    const el = document.createElement("div"); el.className = "chart"; charts.appendChild(el); chart(el, title, r.epochs, s);
  }
  if (r.stages.some((s) => ["running", "queued", "scheduled", "up_for_retry"].includes(s.state))) setTimeout(() => run(dagId, runId), 3000);
}

(async () => {
  try {
    if (q.get("dag_id") && q.get("run_id")) await run(q.get("dag_id"), q.get("run_id"));
    else if (q.get("dag_id")) await pipeline(q.get("dag_id"));
    else await pipelines();
  } catch (e) {
    main.innerHTML = `<p class="bad">${esc(e.message)}</p>`;
  }
})();
