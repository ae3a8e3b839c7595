// The Runs view: every run (#/runs) and one run's page (#/runs/ID, with
// ?compare=ID2 to overlay another run): its fields, its live charts (one
// line per rank, the restarts marked on the time axis), its workers and its
// restarts. app.js routes here and hands over its API call; the charts are
// drawn by uPlot (npm, web/node_modules/uplot), never by hand. A running
// run's page follows its points as the controller commits them
// (server-sent events), and reads the run itself every 2 s.

import { fmtDuration, fmtNum, visible } from './format.js';

const $ = (id) => document.getElementById(id);
const POLL_MS = 2000;
// The charts drawn first, in this order; any other name follows.
const FIRST = ['loss', 'accuracy', 'samples_per_s', 'step_time', 'test_accuracy'];
const COLORS = ['#2f6fde', '#d9480f', '#2b8a3e', '#862e9c', '#e67700', '#0b7285', '#c2255c',
  '#5c940d', '#364fc7', '#a61e4d', '#087f5b', '#495057', '#f08c00', '#1864ab', '#9c36b5', '#2f9e44'];
const MAX_LINES = 8; // ranks drawn one line each; more: their mean, with a min-max band

let api = null;
const view = {
  mode: null, // 'list', 'run' or null (hidden)
  timer: null,
  gen: 0,
  run: null, // the run object
  t0: 0, // its created_at, seconds
  since: 0,
  series: new Map(), // "name|rank" -> {name, rank, xs: [], ys: []}
  compare: null, // {run, t0, series} of the run overlaid
  charts: new Map(), // name -> uPlot
};
// The charts' data, for tests and for the curious: window.musterCharts.
window.musterCharts = view.charts;

export function runsInit(apiCall) {
  api = apiCall;
  $('run-compare-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!view.run) return;
    const other = $('run-compare').value.trim();
    location.hash = `#/runs/${encodeURIComponent(view.run.id)}${other ? `?compare=${encodeURIComponent(other)}` : ''}`;
  });
  window.addEventListener('resize', () => {
    for (const u of view.charts.values()) u.setSize({ width: chartWidth(), height: 220 });
  });
}

function isoSeconds(t) {
  const ms = Date.parse(t);
  return Number.isFinite(ms) ? ms / 1000 : 0;
}

function duration(run) {
  const end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
  return fmtDuration(end - Date.parse(run.created_at));
}

function latestText(latest) {
  const names = Object.keys(latest || {});
  names.sort((a, b) => rankOf(a) - rankOf(b) || a.localeCompare(b));
  return names.slice(0, 4).map((n) => `${n} ${fmtNum(latest[n].value)}`).join(' · ');
}

function rankOf(name) {
  const i = FIRST.indexOf(name);
  return i < 0 ? FIRST.length : i;
}

function cell(tr, text, cls) {
  const td = document.createElement('td');
  if (cls) td.className = cls;
  td.textContent = text;
  tr.appendChild(td);
  return td;
}

function stopTimer() {
  if (view.timer) clearTimeout(view.timer);
  view.timer = null;
  if (view.abort) view.abort.abort();
  view.abort = null;
  view.following = false;
}

// Hides the view (the workers' list is shown instead).
export function hideRuns() {
  view.mode = null;
  view.gen++;
  stopTimer();
  $('runs').hidden = true;
  $('run').hidden = true;
  dropCharts();
}

// ---------- #/runs: every run ----------

export function showRunsList() {
  view.mode = 'list';
  const gen = ++view.gen;
  stopTimer();
  dropCharts();
  $('run').hidden = true;
  $('runs').hidden = false;
  const tick = async () => {
    if (gen !== view.gen) return;
    try {
      const r = await api('/api/v1/runs?limit=200');
      const body = await r.json();
      if (gen !== view.gen) return;
      renderList(body.runs || []);
      $('runs-message').hidden = true;
    } catch (err) {
      if (gen !== view.gen) return;
      $('runs-message').textContent = `Could not read the runs: ${err.message}`;
      $('runs-message').hidden = false;
    }
    view.timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

function renderList(runs) {
  const tbody = $('runs-rows');
  tbody.textContent = '';
  for (const run of runs) {
    const tr = document.createElement('tr');
    tr.dataset.id = run.id;
    tr.tabIndex = 0;
    cell(tr, run.id, 'c-id');
    const st = cell(tr, run.status, 'c-status');
    st.dataset.status = run.status;
    cell(tr, run.mode, 'c-mode');
    cell(tr, String((run.workers || []).length), 'c-n');
    cell(tr, `${run.restarts}/${run.max_restarts}`, 'c-n');
    cell(tr, duration(run), 'c-age');
    cell(tr, visible(latestText(run.latest)), 'c-latest');
    cell(tr, visible(run.failure ? run.failure.split('\n')[0] : ''), 'c-failure');
    const open = () => { location.hash = `#/runs/${encodeURIComponent(run.id)}`; };
    tr.addEventListener('click', open);
    tr.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') open(); });
    tbody.appendChild(tr);
  }
  $('runs-empty').hidden = runs.length > 0;
}

// ---------- #/runs/ID: one run ----------

export function showRun(id, compare) {
  view.mode = 'run';
  const gen = ++view.gen;
  stopTimer();
  dropCharts();
  view.run = null;
  view.since = 0;
  view.series = new Map();
  view.compare = null;
  $('runs').hidden = true;
  $('run').hidden = false;
  $('run-title').textContent = `Run ${id}`;
  $('run-fields').textContent = '';
  $('run-workers').textContent = '';
  $('run-restarts').textContent = '';
  $('run-message').hidden = true;
  $('run-compare').value = compare || '';
  const tick = async () => {
    if (gen !== view.gen) return;
    try {
      await readRun(id, gen);
      $('run-message').hidden = true;
      if (compare && !view.compare && gen === view.gen) {
        try {
          await readCompare(compare, gen);
        } catch (err) {
          // The other run alone: this one's page goes on.
          if (gen !== view.gen) return;
          $('run-message').textContent = err.status === 404 ? `There is no run ${compare} to compare with.` : `Could not read run ${compare}: ${err.message}`;
          $('run-message').hidden = false;
          if (err.status === 404) compare = '';
        }
      }
    } catch (err) {
      if (gen !== view.gen) return;
      $('run-message').textContent = err.status === 404 ? `There is no run ${id}.` : `Could not read run ${id}: ${err.message}`;
      $('run-message').hidden = false;
      if (err.status === 404) return;
    }
    if (gen !== view.gen) return;
    // An ended run never changes: read once more after its end, then stop.
    if (!view.run || view.run.status === 'running' || !view.doneOnce) {
      if (view.run && view.run.status !== 'running') view.doneOnce = true;
      view.timer = setTimeout(tick, POLL_MS);
    }
  };
  view.doneOnce = false;
  tick();
}

async function readRun(id, gen) {
  const r = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
  const run = await r.json();
  if (gen !== view.gen) return;
  view.run = run;
  view.t0 = isoSeconds(run.created_at);
  renderRun(run);
  if (!view.following) follow(id, gen);
}

// Follows the run's points (GET .../metrics?follow=1: server-sent events,
// each call's new points as the controller commits them): every point at
// first (each series at most 1,000, merged evenly), then only the new.
// The answer ends with the run; a broken one is taken up again, after the
// last point it gave, with the next read of the run.
async function follow(id, gen) {
  view.following = true;
  const ctrl = new AbortController();
  view.abort = ctrl;
  const q = view.since ? `since=${view.since}` : 'max_points=1000';
  try {
    const r = await api(`/api/v1/runs/${encodeURIComponent(id)}/metrics?follow=1&${q}`, { signal: ctrl.signal });
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done || gen !== view.gen) break;
      buf += dec.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const data = ev.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (!data || gen !== view.gen) continue;
        const body = JSON.parse(data);
        addPoints(view.series, body.points || [], view.t0);
        view.since = body.next_since;
        view.updates = (view.updates || 0) + 1;
        draw();
      }
    }
  } catch (_) {
    // Aborted (the page moved on) or broken (the controller went away).
  }
  if (gen === view.gen && (!view.run || view.run.status === 'running')) view.following = false;
}

async function readCompare(id, gen) {
  const r = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
  const run = await r.json();
  const m = await api(`/api/v1/runs/${encodeURIComponent(id)}/metrics?max_points=1000`);
  const body = await m.json();
  if (gen !== view.gen) return;
  const series = new Map();
  addPoints(series, body.points || [], isoSeconds(run.created_at));
  view.compare = { run, series };
  draw();
}

function addPoints(series, points, t0) {
  for (const p of points) {
    for (const [name, v] of Object.entries(p.values || {})) {
      const key = `${name}|${p.rank}`;
      let s = series.get(key);
      if (!s) {
        s = { name, rank: p.rank, xs: [], ys: [] };
        series.set(key, s);
      }
      s.xs.push(p.at - t0);
      s.ys.push(v);
      // A page left open on a long run keeps every other point of a line
      // past 4,000 (the controller keeps the whole run, merged evenly).
      if (s.xs.length > 4000) {
        s.xs = s.xs.filter((_, i) => i % 2 === 1);
        s.ys = s.ys.filter((_, i) => i % 2 === 1);
      }
    }
  }
}

function field(dl, name, value) {
  const dt = document.createElement('dt');
  dt.textContent = name;
  const dd = document.createElement('dd');
  dd.textContent = value;
  dl.append(dt, dd);
}

function renderRun(run) {
  $('run-state').textContent = run.status;
  $('run-state').dataset.status = run.status;
  const dl = $('run-fields');
  dl.textContent = '';
  field(dl, 'Mode', run.mode);
  field(dl, 'Command', visible((run.command || []).join(' ')));
  field(dl, 'Session', visible(run.session || ''));
  field(dl, 'Duration', duration(run));
  field(dl, 'Restarts', `${run.restarts} of ${run.max_restarts}`);
  if (Object.keys(run.latest || {}).length) field(dl, 'Latest', visible(latestText(run.latest)));
  if (run.failure) field(dl, 'Failure', visible(run.failure, true));
  const ul = $('run-workers');
  ul.textContent = '';
  for (const w of run.workers || []) {
    const li = document.createElement('li');
    const a = document.createElement('a');
    a.href = `#/workers/${encodeURIComponent(w)}`;
    a.textContent = w;
    li.appendChild(a);
    ul.appendChild(li);
  }
  const ol = $('run-restarts');
  ol.textContent = '';
  for (const c of run.causes || []) {
    const li = document.createElement('li');
    li.textContent = `${c.at}: ${visible(c.cause)}`;
    ol.appendChild(li);
  }
  $('run-restarts-title').hidden = !(run.causes || []).length;
  const st = $('run-stalls');
  st.textContent = '';
  for (const x of run.stalls || []) {
    const li = document.createElement('li');
    const when = document.createElement('div');
    when.textContent = x.at;
    const pre = document.createElement('pre');
    pre.className = 'stall';
    pre.textContent = visible(x.report, true);
    li.append(when, pre);
    st.appendChild(li);
  }
  $('run-stalls-title').hidden = !(run.stalls || []).length;
}

// ---------- charts ----------

function chartWidth() {
  return Math.max(280, Math.min(900, ($('run-charts').clientWidth || 640) - 8));
}

function dropCharts() {
  for (const u of view.charts.values()) u.destroy();
  view.charts.clear();
  const box = $('run-charts');
  if (box) box.textContent = '';
}

// The union of the series' x values, each series' y on it (null where it
// has no point): uPlot's aligned data.
function aligned(list) {
  const xs = [...new Set(list.flatMap((s) => s.xs))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const ys = list.map((s) => {
    const y = new Array(xs.length).fill(null);
    s.xs.forEach((x, i) => { y[at.get(x)] = s.ys[i]; });
    return y;
  });
  return [xs, ...ys];
}

// Many ranks: their mean, least and greatest, over even bins of time (at
// most 600), as three lines.
function meanBand(list) {
  const all = list.flatMap((s) => s.xs.map((x, i) => [x, s.ys[i]])).filter((p) => p[1] !== null);
  if (!all.length) return [];
  const lo = Math.min(...all.map((p) => p[0]));
  const hi = Math.max(...all.map((p) => p[0]));
  const bins = Math.max(1, Math.min(600, Math.round(all.length / list.length)));
  const w = (hi - lo) / bins || 1;
  const acc = new Map();
  for (const [x, y] of all) {
    const b = Math.min(bins - 1, Math.floor((x - lo) / w));
    const a = acc.get(b) || { n: 0, sum: 0, min: Infinity, max: -Infinity };
    a.n++;
    a.sum += y;
    a.min = Math.min(a.min, y);
    a.max = Math.max(a.max, y);
    acc.set(b, a);
  }
  const keys = [...acc.keys()].sort((a, b) => a - b);
  const xs = keys.map((b) => lo + (b + 0.5) * w);
  const pick = (f) => keys.map((b) => f(acc.get(b)));
  return [
    { label: 'mean', xs, ys: pick((a) => a.sum / a.n) },
    { label: 'least', xs, ys: pick((a) => a.min) },
    { label: 'greatest', xs, ys: pick((a) => a.max) },
  ];
}

// The restarts, as vertical lines at their time.
function restartMarks() {
  return (u) => {
    const run = view.run;
    if (!run) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = '#c92a2a';
    ctx.setLineDash([4, 4]);
    ctx.lineWidth = 1.5 * devicePixelRatio;
    for (const c of run.causes || []) {
      const x = u.valToPos(isoSeconds(c.at) - view.t0, 'x', true);
      if (!Number.isFinite(x) || x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  };
}

function draw() {
  const box = $('run-charts');
  if (typeof window.uPlot !== 'function') {
    box.textContent = 'The charts need uPlot, which scripts/setup.sh installs (npm ci --prefix web).';
    return;
  }
  const names = [...new Set([...view.series.values()].map((s) => s.name))];
  names.sort((a, b) => rankOf(a) - rankOf(b) || a.localeCompare(b));
  $('run-nometrics').hidden = names.length > 0;
  for (const name of names) {
    const mine = [...view.series.values()].filter((s) => s.name === name).sort((a, b) => a.rank - b.rank);
    const band = mine.length > MAX_LINES;
    const shown = band ? meanBand(mine) : mine;
    const other = view.compare ? [...view.compare.series.values()].filter((s) => s.name === name && s.rank === 0) : [];
    const lines = [...shown, ...other];
    const data = aligned(lines);
    let u = view.charts.get(name);
    const lineLabel = (s, i) => (i < shown.length ? (band ? s.label : `rank ${s.rank}`) : `${view.compare.run.id} rank 0`);
    const labels = lines.map(lineLabel).join('|');
    if (u && u.musterLabels !== labels) {
      u.destroy();
      view.charts.delete(name);
      u = null;
    }
    if (u) {
      u.setData(data);
      continue;
    }
    const wrap = document.createElement('figure');
    wrap.className = 'chart';
    wrap.dataset.name = name;
    const cap = document.createElement('figcaption');
    cap.textContent = band ? `${name} (the mean of ${mine.length} ranks, between their least and greatest)` : name;
    wrap.appendChild(cap);
    const at = names.indexOf(name);
    const before = [...box.children].find((c) => names.indexOf(c.dataset.name) > at);
    box.insertBefore(wrap, before || null);
    u = new window.uPlot({
      width: chartWidth(),
      height: 220,
      scales: { x: { time: false } },
      axes: [{ label: 'seconds since the run started' }, {}],
      series: [{ label: 'seconds' }, ...lines.map((s, i) => ({
        label: lineLabel(s, i),
        stroke: i >= shown.length ? '#868e96' : band ? (i === 0 ? COLORS[0] : 'rgba(47,111,222,0.35)') : COLORS[i % COLORS.length],
        dash: i < shown.length ? undefined : [6, 4],
        width: band && i > 0 && i < shown.length ? 1 : 1.5,
        spanGaps: true,
        points: { show: false },
      }))],
      // The band between the ranks' least (series 2) and greatest (3).
      bands: band ? [{ series: [3, 2], fill: 'rgba(47,111,222,0.12)' }] : [],
      hooks: { draw: [restartMarks()] },
    }, data, wrap);
    u.musterLabels = labels;
    view.charts.set(name, u);
  }
}
