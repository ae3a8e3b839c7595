// muster's web UI: the worker table with live states, search, stop, and
// a worker's detail (fields, events, logs) at #/workers/ID.
// Plain ES modules, nothing fetched from outside the controller.
//
// Sign-in as Jupyter's: /?token=T stores T in localStorage and removes it
// from the address bar. Every API call carries "Authorization: Bearer T",
// except the event stream: EventSource cannot set headers, so it passes the
// token as ?access_token= (the controller accepts that on /api/v1/events only).

import { LIVE, exitText, fmtBytes, fmtDuration, fmtNum, outcome, resText, visible, visibleWorker } from './format.js';
import { renderEvents, renderFields } from './detail.js';
import { logs, logsClose, logsInit, logsOpen, pollLogs, selectTab } from './logs.js';
import { hideRuns, runsInit, showRun, showRunsList } from './runs.js';

const TOKEN_KEY = 'muster.token';
const STATUSES = ['scheduling', 'starting', 'running', 'succeeded', 'failed', 'stopped'];
const RANK = { scheduling: 0, starting: 1, running: 2, succeeded: 3, failed: 3, stopped: 3 };

const $ = (id) => document.getElementById(id);

// Marker for tests: set once per page load (a reload would change it).
window.__musterPageId = window.__musterPageId || Math.random().toString(36).slice(2);

const state = {
  token: null,
  workers: new Map(), // id -> worker object
  rows: new Map(), // id -> <tr> with .cells
  lastSeq: 0,
  es: null,
  esTimer: null,
  pending: new Set(), // ids to refetch
  pendingTimer: null,
  filterStatus: '',
  filterSession: '',
  // Who is signed in (GET /api/v1/whoami): a list shows their own workers;
  // an administrator, who is sent everyone's, may switch to all of them.
  me: null,
  everyone: false,
  search: '', // what the search box holds, lower case
  runs: new Map(), // run id -> the run's record, as last fetched
  next: undefined, // cursor of the next older page; null when all are loaded
};
window.__muster = state; // for debugging and tests

// ---------- sign-in ----------

function takeTokenFromUrl() {
  const url = new URL(location.href);
  const t = url.searchParams.get('token');
  if (t !== null) {
    if (t) localStorage.setItem(TOKEN_KEY, t.trim());
    url.searchParams.delete('token');
    history.replaceState(history.state, '', url.pathname + url.search + url.hash);
  }
  return localStorage.getItem(TOKEN_KEY);
}

function showSignin(why) {
  why = why || 'This page needs the controller\u2019s API token.';
  // Already shown for this reason: the polls that also got a 401 change nothing.
  if (!$('signin').hidden && $('signin-why').textContent === why) return;
  stopEvents();
  // The detail shows no worker of a controller that refused us; the
  // address keeps it, so signing in again opens it afresh.
  closeDetail();
  $('workers').hidden = true;
  $('conn').hidden = true;
  $('signout').hidden = true;
  $('signin').hidden = false;
  $('signin-why').textContent = why;
  const hint = (file) => {
    $('signin-url').textContent = `${location.protocol}//${location.host}/?token=<the token in ${file}>`;
  };
  hint('the controller\u2019s state directory, file token');
  // The controller names its own token file (a path, never the token).
  fetch('/api/v1/health', { cache: 'no-store' })
    .then((r) => r.json())
    .then((h) => {
      if (h && h.token_file) hint(h.token_file);
    })
    .catch(() => {});
}

function signOut() {
  localStorage.removeItem(TOKEN_KEY);
  state.token = null;
  closeDetail();
  showSignin('Signed out.');
}

// ---------- API ----------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, opts = {}) {
  const headers = { Authorization: `Bearer ${state.token}`, ...(opts.headers || {}) };
  const r = await fetch(path, { ...opts, headers, cache: 'no-store' });
  if (r.status === 401) {
    // The polls check the token: with none, they stop asking.
    state.token = null;
    showSignin('The controller refused the stored token (was its state directory reset?).');
    localStorage.removeItem(TOKEN_KEY);
    throw new ApiError(401, 'unauthorized');
  }
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try {
      const j = await r.json();
      if (j && j.error && j.error.message) msg = j.error.message;
    } catch (_) { /* not JSON */ }
    throw new ApiError(r.status, msg);
  }
  return r;
}

function showMessage(text) {
  const m = $('message');
  m.textContent = text || '';
  m.hidden = !text;
}

// ---------- formatting ----------

function ageText(w, now) {
  const created = Date.parse(w.created_at);
  if (LIVE.has(w.status)) return { text: fmtDuration(now - created), title: `created ${w.created_at}` };
  const end = Date.parse(w.finished_at);
  const start = Date.parse(w.running_at || w.created_at);
  if (!(end >= 0)) return { text: fmtDuration(now - created), title: `created ${w.created_at}` };
  return {
    text: `ran ${fmtDuration(end - start, true)}`,
    title: `created ${w.created_at}, finished ${w.finished_at}`,
  };
}

// What a worker uses, beside what it asked for: cores (from two samples of
// its cpu seconds) and memory while it runs; cpu seconds and the peak once
// it ended. '' where nothing measures it.
const cpuSeen = new Map(); // id -> {cpu, t} of the last sample shown
function useText(w) {
  const u = w.usage;
  if (!u) return '';
  if (!LIVE.has(w.status)) return `used ${fmtNum(u.cpu_seconds)} cpu·s · peak ${fmtBytes(u.memory_peak_bytes)}`;
  const now = Date.now(), prev = cpuSeen.get(w.id);
  let cores = null;
  if (prev && u.cpu_seconds > prev.cpu && now > prev.t) cores = (u.cpu_seconds - prev.cpu) / ((now - prev.t) / 1000);
  if (!prev || u.cpu_seconds !== prev.cpu) cpuSeen.set(w.id, { cpu: u.cpu_seconds, t: now, cores: cores ?? prev?.cores });
  const c = cores ?? prev?.cores;
  return `uses ${c === undefined || c === null ? fmtNum(u.cpu_seconds) + ' cpu·s' : fmtNum(c) + ' cpu'} · ${fmtBytes(u.memory_bytes)}`;
}

// ---------- table ----------

function newer(a, b) {
  // Newest first: created_at descending, then id.
  if (a.created_at !== b.created_at) return a.created_at > b.created_at;
  return a.id > b.id;
}

function makeRow(w) {
  const tr = document.createElement('tr');
  tr.tabIndex = 0;
  tr.dataset.id = w.id;
  const cell = (cls) => {
    const td = document.createElement('td');
    td.className = cls;
    tr.appendChild(td);
    return td;
  };
  const c = {};
  c.id = cell('c-id');
  c.idText = document.createElement('span');
  c.idText.className = 'wid';
  c.name = document.createElement('span');
  c.name.className = 'wname';
  c.id.append(c.idText, c.name);
  c.role = cell('c-role');
  c.session = cell('c-session');
  c.status = cell('c-status');
  c.badge = document.createElement('span');
  c.badge.className = 'badge';
  // Why a scheduling worker waits; which run a worker is part of, and how
  // that run went.
  c.wait = document.createElement('span');
  c.wait.className = 'waiting';
  c.runNote = document.createElement('span');
  c.runNote.className = 'run-note';
  c.status.append(c.badge, c.wait, c.runNote);
  c.ip = cell('c-ip');
  c.res = cell('c-res');
  c.req = document.createElement('span');
  c.use = document.createElement('span');
  c.use.className = 'use';
  c.res.append(c.req, c.use);
  c.age = cell('c-age');
  c.exit = cell('c-exit');
  c.failure = cell('c-failure');
  c.actions = cell('c-actions');
  c.stop = document.createElement('button');
  c.stop.type = 'button';
  c.stop.className = 'stop';
  c.stop.textContent = 'Stop';
  c.stop.addEventListener('click', (ev) => {
    ev.stopPropagation();
    stopWorker(tr.dataset.id);
  });
  c.actions.appendChild(c.stop);
  tr.cells_ = c;
  tr.addEventListener('click', (ev) => {
    if (ev.target.closest('button')) return;
    go(tr.dataset.id);
  });
  tr.addEventListener('keydown', (ev) => {
    if (ev.target !== tr) return;
    if (ev.key === 'Enter' || ev.key === ' ') {
      ev.preventDefault();
      go(tr.dataset.id);
    } else if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
      ev.preventDefault();
      let n = ev.key === 'ArrowDown' ? tr.nextElementSibling : tr.previousElementSibling;
      while (n && n.hidden) n = ev.key === 'ArrowDown' ? n.nextElementSibling : n.previousElementSibling;
      if (n) n.focus();
    }
  });
  return tr;
}

// A failure on one line: its sentence, then the last line of the stderr it
// quotes, if any ("...; its stderr ended with: ZeroDivisionError: ...").
function failureLine(f) {
  if (!f) return '';
  const nl = f.indexOf('\n');
  return nl < 0 ? f : `${f.slice(0, nl)} ${f.slice(f.lastIndexOf('\n') + 1)}`;
}

function fillRow(tr, w, now) {
  const c = tr.cells_;
  tr.dataset.status = w.status;
  c.idText.textContent = w.id;
  c.name.textContent = w.name || '';
  c.name.hidden = !w.name;
  c.role.textContent = w.role || '';
  c.session.textContent = w.session || '';
  const o = outcome(w, w.run ? state.runs.get(w.run) : null);
  c.badge.textContent = o.label;
  c.badge.className = `badge s-${o.kind === 'completed' ? 'completed' : w.status}`;
  tr.dataset.outcome = o.kind;
  c.runNote.textContent = o.note;
  c.runNote.hidden = !o.note;
  c.wait.textContent = w.status === 'scheduling' && w.waiting_for ? `waiting for ${w.waiting_for}` : '';
  c.wait.hidden = !c.wait.textContent;
  c.ip.textContent = w.ip_address || '';
  c.req.textContent = resText(w);
  c.use.textContent = useText(w);
  c.use.hidden = !c.use.textContent;
  const a = ageText(w, now);
  c.age.textContent = a.text;
  c.age.title = a.title;
  c.exit.textContent = exitText(w);
  // One line in the table (the sentence and the last line of the stderr it
  // quotes); the whole failure, traceback and all, in the tooltip and the
  // detail.
  const failLine = failureLine(w.failure);
  c.failure.textContent = failLine;
  c.failure.title = w.failure || '';
  c.status.dataset.failure = failLine;
  c.stop.hidden = !LIVE.has(w.status);
  c.stop.setAttribute('aria-label', `Stop ${w.name || w.id}`);
  const why = failLine || c.wait.textContent || o.note;
  tr.setAttribute('aria-label', `${w.name || w.id}, ${o.label}${why ? ': ' + why : ''}`);
  tr.hidden = !matchesFilter(w);
}

function matchesFilter(w) {
  const fs = state.filterStatus;
  if (fs === 'live' && !LIVE.has(w.status)) return false;
  if (fs && fs !== 'live' && w.status !== fs) return false;
  if (state.filterSession && w.session !== state.filterSession) return false;
  if (state.me && !state.everyone && w.user && w.user !== state.me.user) return false;
  const q = state.search;
  if (q && !w.id.toLowerCase().includes(q) && !(w.name || '').toLowerCase().includes(q)) return false;
  return true;
}

// Merges a fetched or event-derived worker; never moves a worker back in
// its state machine (an older answer can arrive after a newer event).
function upsert(fetched) {
  const w = visibleWorker(fetched);
  const old = state.workers.get(w.id);
  if (old && RANK[old.status] > RANK[w.status]) return;
  if (old && RANK[old.status] === 3 && old.status !== w.status) return; // terminal never changes
  state.workers.set(w.id, w);
  const tbody = $('rows');
  let tr = state.rows.get(w.id);
  if (!tr) {
    tr = makeRow(w);
    state.rows.set(w.id, tr);
    // Insert in order, newest first.
    let before = null;
    for (const other of tbody.children) {
      const ow = state.workers.get(other.dataset.id);
      if (ow && newer(w, ow)) {
        before = other;
        break;
      }
    }
    tbody.insertBefore(tr, before);
    tr.classList.toggle('selected', w.id === detail.id);
  }
  fillRow(tr, w, Date.now());
  if (w.run && !LIVE.has(w.status)) wantRun(w.run);
  if (detail.id === w.id) {
    // The detail's own read failed or is still retrying: the worker is here
    // now, so are its events and logs.
    if (!detail.loaded) detailLoaded();
    renderDetail();
  }
}

// ---------- runs: the outcome of a run, shown on its workers ----------

// Runs to fetch soon: those of ended workers (a stopped worker of a run
// that succeeded is no abort) and of the open detail.
const runsWanted = new Set();
let runsTimer = null;

function wantRun(id) {
  const r = state.runs.get(id);
  if (r && r.status !== 'running') return; // an ended run never changes
  runsWanted.add(id);
  if (!runsTimer) runsTimer = setTimeout(fetchRuns, 50);
}

async function fetchRun(id) {
  let run;
  try {
    const r = await api(`/api/v1/runs/${encodeURIComponent(id)}`);
    run = await r.json();
  } catch (err) {
    // Gone (pruned): asked no more, the rows show their status alone. The
    // controller away: asked again with the next change.
    if (err.status === 404) state.runs.set(id, { id, status: null });
    return;
  }
  const before = state.runs.get(id);
  state.runs.set(id, run);
  if (before && before.status === run.status) return;
  const now = Date.now();
  for (const [wid, tr] of state.rows) {
    const w = state.workers.get(wid);
    if (w && w.run === id) fillRow(tr, w, now);
  }
  if (detail.id && state.workers.get(detail.id)?.run === id) renderDetail();
}

// A few at a time: a first page can hold the workers of many runs.
async function fetchRuns() {
  const ids = [...runsWanted];
  runsWanted.clear();
  for (let i = 0; i < ids.length; i += 8) await Promise.all(ids.slice(i, i + 8).map(fetchRun));
  runsTimer = null;
  if (runsWanted.size) runsTimer = setTimeout(fetchRuns, 50);
}

// A run's end comes after its workers were stopped, with no event of its
// own: the runs that still run, with an ended worker shown, are read again.
function pollRuns() {
  const shown = new Set();
  for (const w of state.workers.values()) if (w.run && !LIVE.has(w.status)) shown.add(w.run);
  for (const id of shown) {
    const r = state.runs.get(id);
    // Never read (the controller was away then), or still running.
    if (!r || r.status === 'running') wantRun(id);
  }
}

function renderSummary() {
  const counts = Object.fromEntries(STATUSES.map((s) => [s, 0]));
  const sessions = new Set();
  for (const w of state.workers.values()) {
    counts[w.status] = (counts[w.status] || 0) + 1;
    if (w.session) sessions.add(w.session);
  }
  const box = $('counts');
  const want = ['all', ...STATUSES];
  if (box.children.length !== want.length) {
    box.textContent = '';
    for (const s of want) {
      const b = document.createElement('button');
      b.type = 'button';
      b.className = `count s-${s}`;
      b.dataset.status = s;
      const n = document.createElement('span');
      n.className = 'n';
      const l = document.createElement('span');
      l.className = 'l';
      l.textContent = s;
      b.append(n, l);
      b.addEventListener('click', () => {
        const v = s === 'all' ? '' : s;
        $('filter-status').value = state.filterStatus === v ? '' : v;
        setFilters();
      });
      box.appendChild(b);
    }
  }
  for (const b of box.children) {
    const s = b.dataset.status;
    const n = s === 'all' ? state.workers.size : counts[s];
    b.querySelector('.n').textContent = String(n);
    b.classList.toggle('zero', n === 0);
    const active = (s === 'all' ? '' : s) === state.filterStatus;
    b.setAttribute('aria-pressed', String(active));
  }
  // Session filter options.
  const sel = $('filter-session');
  const have = new Set([...sel.options].map((o) => o.value));
  for (const s of [...sessions].sort()) {
    if (!have.has(s)) {
      const o = document.createElement('option');
      o.value = s;
      o.textContent = s;
      sel.appendChild(o);
    }
  }
  let visible = 0;
  for (const tr of state.rows.values()) if (!tr.hidden) visible++;
  const empty = $('empty');
  empty.hidden = visible > 0;
  if (state.workers.size > 0 && visible === 0) empty.textContent = 'No worker matches these filters.';
  else if (state.workers.size === 0) {
    empty.textContent = '';
    empty.append('No workers yet. Launch some with ');
    const c1 = document.createElement('code');
    c1.textContent = 'muster launch -n 2';
    empty.append(c1, ' or ');
    const c2 = document.createElement('code');
    c2.textContent = 'POST /api/v1/workers';
    empty.append(c2, '.');
  }
}

// The live sessions (a worker not ended, or a lease) and their leases: a
// session whose lease runs out has its workers stopped by the controller.
// Items are updated in place (a click is never lost to a redraw).
function sessionItem(name) {
  const li = document.createElement('li');
  li.className = 'session';
  li.dataset.session = name;
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'link name';
  b.textContent = name;
  b.title = 'Show this session\'s workers';
  b.addEventListener('click', () => {
    const sel = $('filter-session');
    if (![...sel.options].some((o) => o.value === name)) {
      const o = document.createElement('option');
      o.value = name;
      o.textContent = name;
      sel.appendChild(o);
    }
    sel.value = state.filterSession === name ? '' : name;
    setFilters();
  });
  const live = document.createElement('span');
  live.className = 'live';
  const lease = document.createElement('span');
  lease.className = 'lease';
  li.append(b, live, lease);
  return li;
}

function renderSessions(list) {
  const ul = $('sessions');
  const have = new Map([...ul.children].map((li) => [li.dataset.session, li]));
  list.sort((a, b) => a.name.localeCompare(b.name));
  let prev = null;
  for (const s of list) {
    let li = have.get(s.name);
    have.delete(s.name);
    if (!li) li = sessionItem(s.name);
    const next = prev ? prev.nextSibling : ul.firstChild;
    if (li !== next) ul.insertBefore(li, next);
    prev = li;
    li.querySelector('.live').textContent = `${s.live_workers} live`;
    const lease = li.querySelector('.lease');
    if (s.lease && s.lease.stops_workers === false) {
      lease.textContent = 'run clients only';
      lease.title = 'its holders bind only their runs (muster run --no-lease): the workers stay ' +
        'when they are gone';
      li.classList.remove('late');
    } else if (s.lease) {
      const left = Math.round(s.lease.seconds_left);
      lease.textContent = `lease: ${left} s left of ${fmtNum(s.lease.ttl_seconds)} s`;
      lease.title = `renewed by its client every ${fmtNum(s.lease.ttl_seconds / 3)} s; if it runs out ` +
        `(at ${s.lease.expires_at}), the session's workers are stopped`;
      li.classList.toggle('late', s.lease.seconds_left < s.lease.ttl_seconds / 3);
    } else {
      lease.textContent = 'no lease';
      lease.title = 'its workers stay until they end or are stopped';
      li.classList.remove('late');
    }
  }
  for (const li of have.values()) li.remove();
  // The strip keeps its height when empty: nothing below it moves.
  let note = ul.querySelector('.empty-note');
  if (list.length === 0 && !note) {
    note = document.createElement('li');
    note.className = 'empty-note';
    note.textContent = 'No live session.';
    ul.appendChild(note);
  } else if (list.length > 0 && note) {
    note.remove();
  }
}

// Says who is signed in; an administrator gets the switch to everyone's.
async function loadWhoami() {
  try {
    const r = await api('/api/v1/whoami');
    state.me = await r.json();
  } catch {
    state.me = null;
  }
  const who = $('whoami');
  who.textContent = state.me ? `signed in as ${visible(state.me.user)}${state.me.admin ? ' (administrator)' : ''}` : '';
  who.hidden = !state.me;
  $('everyone-label').hidden = !(state.me && state.me.admin);
  state.everyone = $('everyone').checked;
}

async function loadSessions() {
  const r = await api('/api/v1/sessions');
  renderSessions((await r.json()).sessions);
}

function setFilters() {
  state.filterStatus = $('filter-status').value;
  state.filterSession = $('filter-session').value;
  state.search = $('search').value.trim().toLowerCase();
  const now = Date.now();
  for (const [id, tr] of state.rows) fillRow(tr, state.workers.get(id), now);
  renderSummary();
}

function tickAges() {
  const now = Date.now();
  for (const [id, tr] of state.rows) {
    const w = state.workers.get(id);
    if (!w) continue;
    const a = ageText(w, now);
    if (tr.cells_.age.textContent !== a.text) tr.cells_.age.textContent = a.text;
  }
}

// The table shows the newest PAGE workers; older ones come a page at a time
// ("Load older workers"), so that a controller with 100,000 finished workers
// costs the page what 200 do.
const PAGE = 200;

function setNext(cursor) {
  state.next = cursor || null;
  $('more').hidden = !state.next;
}

async function loadList() {
  const r = await api(`/api/v1/workers?limit=${PAGE}`);
  const seq = Number(r.headers.get('X-Muster-Last-Event') || '0');
  const body = await r.json();
  for (const w of body.workers) upsert(w);
  // The first load sets where older pages start; later reloads of the
  // newest page leave what was loaded below it alone.
  if (state.next === undefined) setNext(body.next);
  renderSummary();
  return seq;
}

async function loadMore() {
  if (!state.next) return;
  const r = await api(`/api/v1/workers?limit=${PAGE}&before=${encodeURIComponent(state.next)}`);
  const body = await r.json();
  for (const w of body.workers) upsert(w);
  setNext(body.next);
  renderSummary();
}

// ---------- live events ----------

function setConn(kind, text) {
  const c = $('conn');
  c.hidden = false;
  c.dataset.state = kind;
  $('conn-text').textContent = text;
}

function stopEvents() {
  clearTimeout(state.esTimer);
  state.esTimer = null;
  if (state.es) {
    state.es.close();
    state.es = null;
  }
}

function startEvents() {
  stopEvents();
  if (!state.token) return;
  const url = `/api/v1/events?since=${state.lastSeq}&access_token=${encodeURIComponent(state.token)}`;
  const es = new EventSource(url);
  state.es = es;
  es.onopen = () => {
    if (state.es !== es) return;
    setConn('live', 'live');
    if (state.needResync) {
      // Back after a closed stream: the list may hold changes the events
      // cannot replay (a worker's ip or failure); refresh the live ones.
      state.needResync = false;
      for (const w of state.workers.values()) if (LIVE.has(w.status)) queueRefetch(w.id);
      if (detail.id && detail.loaded) loadDetailEvents();
    }
  };
  es.onmessage = (ev) => {
    if (state.es !== es) return;
    let e;
    try {
      e = JSON.parse(ev.data);
    } catch (_) {
      return;
    }
    onEvent(e);
  };
  // Too far behind to catch up event by event: list again, follow from there.
  es.addEventListener('too_far_behind', async () => {
    if (state.es !== es) return;
    stopEvents();
    try {
      state.lastSeq = await loadList();
    } catch (_) {
      /* the reconnect below retries */
    }
    startEvents();
  });
  es.onerror = () => {
    if (state.es !== es) return;
    if (es.readyState === EventSource.CLOSED) {
      // Closed for good (an HTTP error answer, e.g. while the controller
      // shuts down): start again after 1 s from the last seq seen.
      setConn('down', 'reconnecting…');
      state.es = null;
      state.needResync = true;
      clearTimeout(state.esTimer);
      state.esTimer = setTimeout(async () => {
        // A refused token shows the sign-in page instead of looping.
        try {
          await api('/api/v1/workers?status=scheduling');
        } catch (err) {
          if (err.status === 401) return;
        }
        startEvents();
      }, 1000);
    } else {
      // The browser reconnects by itself, with Last-Event-ID.
      setConn('down', 'reconnecting…');
      state.needResync = true;
    }
  };
}

function onEvent(e) {
  if (typeof e.seq === 'number' && e.seq > state.lastSeq) state.lastSeq = e.seq;
  if (e.worker_id === detail.id) loadDetailEvents();
  const w = state.workers.get(e.worker_id);
  if (!w || e.from === null) {
    queueRefetch(e.worker_id);
    return;
  }
  // Show the new status at once, then fetch the details (ip, exit code, failure).
  if (e.to && RANK[e.to] !== undefined && RANK[e.to] >= RANK[w.status] && RANK[w.status] < 3) {
    const copy = { ...w, status: e.to };
    if (!LIVE.has(e.to) && !copy.finished_at) copy.finished_at = e.at;
    if (e.to === 'running' && !copy.running_at) copy.running_at = e.at;
    upsert(copy);
    renderSummary();
  }
  queueRefetch(e.worker_id);
}

function queueRefetch(id) {
  state.pending.add(id);
  if (!state.pendingTimer) state.pendingTimer = setTimeout(flushRefetch, 50);
}

async function flushRefetch() {
  state.pendingTimer = null;
  const ids = [...state.pending];
  state.pending.clear();
  if (!ids.length) return;
  try {
    if (ids.length > 20) {
      // Many changes at once (a big launch, a reconnect): one list is cheaper.
      await loadList();
    } else {
      await Promise.all(
        ids.map(async (id) => {
          try {
            const r = await api(`/api/v1/workers/${encodeURIComponent(id)}`);
            upsert(await r.json());
          } catch (err) {
            if (err.status !== 404 && err.status !== 401) throw err;
          }
        }),
      );
      renderSummary();
    }
  } catch (err) {
    if (err.status === 401) return;
    // The controller is away; try these again shortly.
    for (const id of ids) state.pending.add(id);
    if (!state.pendingTimer) state.pendingTimer = setTimeout(flushRefetch, 1000);
  }
}

// ---------- stop ----------

async function stopWorker(id) {
  const w = state.workers.get(id);
  if (!w || !LIVE.has(w.status)) return;
  if (!confirm(`Stop worker ${w.name ? w.name + ' (' + id + ')' : id}?`)) return;
  try {
    const r = await api(`/api/v1/workers/${encodeURIComponent(id)}`, { method: 'DELETE' });
    upsert(await r.json());
    renderSummary();
    showMessage('');
  } catch (err) {
    if (err.status !== 401) showMessage(`Could not stop ${id}: ${err.message}`);
  }
}

// ---------- the worker detail (#/workers/ID) ----------

// The open detail: the worker's id, its events (null until loaded, and
// whether older ones were left out), the row to give focus back to, and a
// generation that stale answers check. missing: why there is no such
// worker (a 404); loaded: whether its events and logs were started;
// retry: the timer that reads it again after an error.
const detail = {
  id: null, events: null, truncated: false, evError: null, evReq: 0, missing: null,
  trouble: null, loaded: false, opener: null, gen: 0, retry: null, shown: '',
};

// Opens worker id's detail (its fields, events and logs) beside the list;
// again = read it afresh when it is the one already open.
function openDetail(id, again = false) {
  if (detail.id === id && !again) return;
  if (detail.id === id) logsClose(); // logsOpen starts over below
  clearTimeout(detail.retry);
  detail.id = id;
  detail.gen++;
  detail.events = null;
  detail.truncated = false;
  detail.evError = null;
  detail.missing = null;
  detail.trouble = null;
  detail.loaded = false;
  detail.shown = '';
  detail.opener = document.activeElement && document.activeElement.closest?.('#rows tr')
    ? document.activeElement : state.rows.get(id) || null;
  logsOpen(id);
  $('detail').hidden = false;
  document.body.classList.add('detail-open');
  for (const tr of state.rows.values()) tr.classList.toggle('selected', tr.dataset.id === id);
  selectTab(logs.stream, false);
  renderDetail();
  $('detail-close').focus();
  readDetail(detail.gen, 0);
}

// Reads the open worker afresh (a deep link can name a worker older than
// the list's first page), then its events and logs. Only a 404 says there
// is no such worker; any other error (the controller restarting) is
// retried, backing off to 10 s.
async function readDetail(gen, tries) {
  const id = detail.id;
  try {
    const r = await api(`/api/v1/workers/${encodeURIComponent(id)}`);
    const w = await r.json();
    if (gen !== detail.gen) return;
    detail.trouble = null;
    upsert(w);
    if (w.run) wantRun(w.run);
    if (!detail.loaded) detailLoaded();
  } catch (err) {
    if (gen !== detail.gen || err.status === 401) return;
    if (err.status === 404) {
      detail.missing = `There is no worker ${id} (it may have been pruned).`;
    } else {
      detail.trouble = `Could not read ${id} (${err.message}); trying again…`;
      detail.retry = setTimeout(() => readDetail(gen, tries + 1), Math.min(10000, 1000 * 2 ** tries));
    }
    renderDetail();
  }
}

// The open worker is known: its events and logs start.
function detailLoaded() {
  detail.loaded = true;
  detail.missing = null;
  loadDetailEvents();
  pollLogs();
}

function closeDetail() {
  if (!detail.id) return;
  const opener = detail.opener;
  detail.id = null;
  detail.gen++;
  clearTimeout(detail.retry);
  logsClose();
  $('detail').hidden = true;
  document.body.classList.remove('detail-open');
  for (const tr of state.rows.values()) tr.classList.remove('selected');
  if (opener && document.contains(opener)) opener.focus();
}

// Reads the open worker's events. Only the newest request's answer counts
// (two quick changes start two reads); an error is shown and read again
// with the next event or resync.
async function loadDetailEvents() {
  const id = detail.id;
  const gen = detail.gen;
  if (!id || !detail.loaded) return;
  const n = ++detail.evReq;
  try {
    const r = await api(`/api/v1/workers/${encodeURIComponent(id)}/events`);
    const body = await r.json();
    if (gen !== detail.gen || n !== detail.evReq) return;
    detail.events = body.events;
    detail.truncated = !!body.truncated;
    detail.evError = null;
  } catch (err) {
    if (gen !== detail.gen || n !== detail.evReq || err.status === 401) return;
    detail.evError = `events unavailable (${err.message}); trying again…`;
    clearTimeout(detail.evRetry);
    detail.evRetry = setTimeout(() => {
      if (gen === detail.gen && detail.evError) loadDetailEvents();
    }, 3000);
  }
  renderEvents($('detail-events'), detail.events, detail.truncated, detail.evError);
}

function renderDetail() {
  const w = state.workers.get(detail.id);
  const title = $('detail-title');
  if (!w) {
    title.textContent = detail.id;
    $('detail-state').hidden = true;
    $('detail-stop').hidden = true;
    $('detail-fields').textContent = detail.missing || detail.trouble || 'loading…';
    $('detail-events').textContent = '';
    $('logs').hidden = !!detail.missing;
    detail.shown = '';
    return;
  }
  $('logs').hidden = false;
  const run = w.run ? state.runs.get(w.run) : null;
  const o = outcome(w, run);
  title.textContent = w.name ? `${w.name} (${w.id})` : w.id;
  const st = $('detail-state');
  st.hidden = false;
  st.textContent = o.label;
  st.className = `badge s-${o.kind === 'completed' ? 'completed' : w.status}`;
  $('detail-stop').hidden = !LIVE.has(w.status);
  $('detail-stop').setAttribute('aria-label', `Stop ${w.name || w.id}`);
  // Rebuilt only when something shown changed: a selection in it (a
  // command being copied) survives the polls.
  const shown = JSON.stringify([w, run && run.status, run && run.causes]);
  if (shown !== detail.shown) {
    detail.shown = shown;
    renderFields($('detail-fields'), w, run);
  }
  renderEvents($('detail-events'), detail.events, detail.truncated, detail.evError);
  const s = $('logs-state');
  s.textContent = LIVE.has(w.status) ? 'following' : '';
}

// ---------- routes: #/ (the list) and #/workers/ID, each with ?q=SEARCH ----------

function parseHash() {
  const h = location.hash.replace(/^#/, '');
  const qi = h.indexOf('?');
  const p = qi < 0 ? h : h.slice(0, qi);
  const params = new URLSearchParams(qi < 0 ? '' : h.slice(qi + 1));
  const dec = (v) => {
    try {
      return decodeURIComponent(v);
    } catch (_) {
      return v;
    }
  };
  const m = /^\/workers\/([^/]+)$/.exec(p);
  const run = /^\/runs\/([^/]+)$/.exec(p);
  return {
    id: m ? dec(m[1]) : null,
    runs: p === '/runs' || !!run,
    run: run ? dec(run[1]) : null,
    compare: params.get('compare') || '',
    q: params.get('q') || '',
  };
}

function hashFor(id, q) {
  let h = id ? `#/workers/${encodeURIComponent(id)}` : '#/';
  if (q) h += `?q=${encodeURIComponent(q)}`;
  return h;
}

// Opens worker id's detail (null: the list alone) as a new history entry,
// so that back and forward move between them.
function go(id) {
  const h = hashFor(id, $('search').value.trim());
  if (location.hash !== h) location.hash = h;
  else route(true);
}

// Shows what the address says: the search, and the detail it names.
// again: the user asked for the open worker once more (read it afresh).
function route(again = false) {
  if (!state.token) return;
  const r = parseHash();
  $('nav-workers').removeAttribute('aria-current');
  $('nav-runs').removeAttribute('aria-current');
  $(r.runs ? 'nav-runs' : 'nav-workers').setAttribute('aria-current', 'page');
  if (r.runs) {
    closeDetail();
    $('workers').hidden = true;
    if (r.run) showRun(r.run, r.compare);
    else showRunsList();
    return;
  }
  hideRuns();
  $('workers').hidden = false;
  if ($('search').value.trim() !== r.q) $('search').value = r.q;
  if (state.search !== r.q.toLowerCase()) setFilters();
  if (r.id) openDetail(r.id, again === true);
  else closeDetail();
}

// Typing in the search box narrows the list at once; the address follows
// without a history entry per key.
function onSearch() {
  history.replaceState(history.state, '', location.pathname + location.search + hashFor(detail.id, $('search').value.trim()));
  setFilters();
}

// ---------- start ----------

async function start() {
  $('signout').addEventListener('click', signOut);
  $('more').addEventListener('click', () => {
    loadMore().catch(() => setConn('down', 'could not load older workers'));
  });
  $('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('signin-token').value.trim();
    if (!t) return;
    localStorage.setItem(TOKEN_KEY, t);
    $('signin-token').value = '';
    boot();
  });
  $('filter-status').addEventListener('change', setFilters);
  $('filter-session').addEventListener('change', setFilters);
  $('everyone').addEventListener('change', () => {
    state.everyone = $('everyone').checked;
    setFilters();
  });
  $('search').addEventListener('input', onSearch);
  $('detail-close').addEventListener('click', () => go(null));
  $('detail-stop').addEventListener('click', () => {
    if (detail.id) stopWorker(detail.id);
  });
  window.addEventListener('hashchange', route);
  for (const b of document.querySelectorAll('.tabs [role=tab]')) {
    b.addEventListener('click', () => selectTab(b.dataset.stream));
    b.addEventListener('keydown', (ev) => {
      if (ev.key === 'ArrowLeft' || ev.key === 'ArrowRight') {
        ev.preventDefault();
        const other = logs.stream === 'stdout' ? 'stderr' : 'stdout';
        selectTab(other);
        $(`tab-${other}`).focus();
      }
    });
  }
  document.addEventListener('keydown', (ev) => {
    if (ev.key === 'Escape' && detail.id && !ev.target.closest?.('input')) go(null);
  });
  setInterval(tickAges, 1000);
  // Usage is sampled once a second, and a waiting worker's reason changes
  // as others come and go, with no event of its own: the running and
  // waiting workers are read again every few seconds.
  setInterval(() => {
    if (document.hidden || !state.token) return;
    api('/api/v1/workers?status=scheduling,running&limit=500')
      .then((r) => r.json())
      .then((body) => body.workers.forEach(upsert))
      .catch(() => {});
  }, 3000);
  // Leases are renewed without events: their state is read every 2 s.
  setInterval(() => {
    if (document.hidden || !state.token) return;
    loadSessions().catch(() => {});
    pollRuns();
  }, 2000);
  logsInit(api, (id) => state.workers.get(id)?.status);
  runsInit(api);
  state.token = takeTokenFromUrl();
  boot();
}

// Forgets the workers and runs shown: a sign-in (again) may be to another
// controller, or to one whose state directory was reset.
function clearList() {
  state.workers.clear();
  state.rows.clear();
  state.runs.clear();
  state.lastSeq = 0;
  state.next = undefined;
  cpuSeen.clear();
  $('rows').textContent = '';
}

async function boot() {
  state.token = localStorage.getItem(TOKEN_KEY);
  if (!state.token) {
    showSignin();
    return;
  }
  $('signin').hidden = true;
  $('workers').hidden = false;
  $('signout').hidden = false;
  setConn('down', 'connecting…');
  clearList();
  await loadWhoami();
  for (;;) {
    try {
      state.lastSeq = await loadList();
      break;
    } catch (err) {
      if (err.status === 401) return;
      setConn('down', 'controller unreachable, retrying…');
      await new Promise((res) => setTimeout(res, 2000));
    }
  }
  startEvents();
  route();
}

start();
