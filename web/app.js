// muster's web UI: the worker table with live states, logs, stop.
// Plain ES module, nothing fetched from outside the controller.
//
// Sign-in as Jupyter's: /?token=T stores T in localStorage and removes it
// from the address bar. Every API call carries "Authorization: Bearer T",
// except the event stream: EventSource cannot set headers, so it passes the
// token as ?access_token= (the controller accepts that on /api/v1/events only).

const TOKEN_KEY = 'muster.token';
const STATUSES = ['scheduling', 'starting', 'running', 'succeeded', 'failed', 'stopped'];
const LIVE = new Set(['scheduling', 'starting', 'running']);
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
  stopEvents();
  $('workers').hidden = true;
  $('conn').hidden = true;
  $('signout').hidden = true;
  $('signin').hidden = false;
  $('signin-why').textContent = why || 'This page needs the controller\u2019s API token.';
  $('signin-url').textContent = `${location.protocol}//${location.host}/?token=<the token in ~/.muster/token>`;
}

function signOut() {
  localStorage.removeItem(TOKEN_KEY);
  state.token = null;
  closeLogs();
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

// precise: tenths of a second under 10 s (run durations); ages tick in seconds.
function fmtDuration(ms, precise = false) {
  if (!(ms >= 0)) return '';
  if (precise && ms < 10000) return `${(Math.floor(ms / 100) / 10).toFixed(1)}s`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

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

function fmtNum(v) {
  if (v === null || v === undefined) return '–';
  return String(Math.round(v * 100) / 100);
}

function resText(w) {
  let s = `${fmtNum(w.cpu)} cpu · ${fmtNum(w.memory)} GiB`;
  if (w.nvidia_gpu) s += ` · ${w.nvidia_gpu} gpu`;
  return s;
}

function fmtBytes(b) {
  if (b === null || b === undefined) return '–';
  if (b < 1024 * 1024) return `${Math.round(b / 1024)} KiB`;
  if (b < 1024 * 1024 * 1024) return `${Math.round(b / (1024 * 1024))} MiB`;
  return `${(b / (1024 * 1024 * 1024)).toFixed(1)} GiB`;
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

function exitText(w) {
  if (w.exit_code !== null && w.exit_code !== undefined) return String(w.exit_code);
  if (w.signal) return `sig ${w.signal}`;
  return '';
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
  c.status.appendChild(c.badge);
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
    openLogs(tr.dataset.id);
  });
  tr.addEventListener('keydown', (ev) => {
    if (ev.target !== tr) return;
    if (ev.key === 'Enter' || ev.key === ' ') {
      ev.preventDefault();
      openLogs(tr.dataset.id);
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
  c.badge.textContent = w.status;
  c.badge.className = `badge s-${w.status}`;
  c.ip.textContent = w.ip_address || '';
  c.req.textContent = resText(w);
  c.use.textContent = useText(w);
  c.use.hidden = !c.use.textContent;
  const a = ageText(w, now);
  c.age.textContent = a.text;
  c.age.title = a.title;
  c.exit.textContent = exitText(w);
  // One line in the table (the sentence and the last line of the stderr it
  // quotes); the whole failure, traceback and all, in the tooltip.
  c.failure.textContent = failureLine(w.failure);
  c.failure.title = w.failure || '';
  c.status.dataset.failure = failureLine(w.failure);
  c.stop.hidden = !LIVE.has(w.status);
  c.stop.setAttribute('aria-label', `Stop ${w.name || w.id}`);
  tr.setAttribute('aria-label', `${w.name || w.id}, ${w.status}${w.failure ? ': ' + failureLine(w.failure) : ''}`);
  tr.hidden = !matchesFilter(w);
}

function matchesFilter(w) {
  const fs = state.filterStatus;
  if (fs === 'live' && !LIVE.has(w.status)) return false;
  if (fs && fs !== 'live' && w.status !== fs) return false;
  if (state.filterSession && w.session !== state.filterSession) return false;
  return true;
}

// Merges a fetched or event-derived worker; never moves a worker back in
// its state machine (an older answer can arrive after a newer event).
function upsert(w) {
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
  }
  fillRow(tr, w, Date.now());
  if (logs.id === w.id) updateLogsHead();
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

async function loadSessions() {
  const r = await api('/api/v1/sessions');
  renderSessions((await r.json()).sessions);
}

function setFilters() {
  state.filterStatus = $('filter-status').value;
  state.filterSession = $('filter-session').value;
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

// ---------- logs ----------

const MAX_LOG_CHARS = 1 << 20; // keep the last 1 Mi characters on the page

const logs = {
  id: null,
  stream: 'stdout',
  data: {}, // stream -> {offset, text, decoder}
  timer: null,
  busy: false,
  gen: 0,
};

function openLogs(id) {
  const w = state.workers.get(id);
  if (!w) return;
  if (logs.id !== id) {
    logs.id = id;
    logs.gen++;
    logs.data = {};
    $('logs-text').textContent = '';
  }
  logs.opener = state.rows.get(id);
  $('logs').hidden = false;
  document.body.classList.add('logs-open');
  for (const tr of state.rows.values()) tr.classList.toggle('selected', tr.dataset.id === id);
  selectTab(logs.stream, false);
  updateLogsHead();
  $(`tab-${logs.stream}`).focus();
  pollLogs();
}

function closeLogs() {
  if (!logs.id) return;
  const opener = logs.opener;
  logs.id = null;
  logs.gen++;
  clearTimeout(logs.timer);
  $('logs').hidden = true;
  document.body.classList.remove('logs-open');
  for (const tr of state.rows.values()) tr.classList.remove('selected');
  if (opener && document.contains(opener)) opener.focus();
}

function updateLogsHead() {
  const w = state.workers.get(logs.id);
  if (!w) return;
  $('logs-title').textContent = `Logs of ${w.name || w.id}`;
  const s = $('logs-state');
  s.textContent = LIVE.has(w.status) ? `${w.status} · following` : w.status;
  s.className = `logs-state badge s-${w.status}`;
}

function selectTab(stream, poll = true) {
  logs.stream = stream;
  for (const b of document.querySelectorAll('.tabs [role=tab]')) {
    const on = b.dataset.stream === stream;
    b.setAttribute('aria-selected', String(on));
    b.tabIndex = on ? 0 : -1;
  }
  const d = logs.data[stream];
  const pre = $('logs-text');
  pre.textContent = d ? d.text : '';
  pre.classList.toggle('placeholder', !d || !d.text);
  if (!d || !d.text) pre.textContent = d ? '(nothing on ' + stream + ' yet)' : 'loading…';
  pre.scrollTop = pre.scrollHeight;
  if (poll) pollLogs();
}

// Fetches what is new on one stream of worker id, for the panel of
// generation gen: nothing once the panel closed or moved to another worker
// (the id is the one the poll started with, never a later one, or null).
async function fetchStream(id, stream, gen) {
  if (gen !== logs.gen) return;
  let d = logs.data[stream];
  if (!d) d = logs.data[stream] = { offset: 0, text: '', decoder: new TextDecoder() };
  const r = await api(
    `/api/v1/workers/${encodeURIComponent(id)}/logs?stream=${stream}&offset=${d.offset}`,
  );
  const buf = await r.arrayBuffer();
  if (gen !== logs.gen) return;
  d.loaded = true;
  if (!buf.byteLength) return;
  d.offset += buf.byteLength;
  d.text += d.decoder.decode(buf, { stream: true });
  if (d.text.length > MAX_LOG_CHARS) d.text = '[…]\n' + d.text.slice(-MAX_LOG_CHARS);
  if (stream === logs.stream) {
    const pre = $('logs-text');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    pre.classList.remove('placeholder');
    pre.textContent = d.text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
}

async function pollLogs() {
  clearTimeout(logs.timer);
  if (!logs.id || logs.busy) return;
  const gen = logs.gen;
  const id = logs.id;
  const w = state.workers.get(id);
  const live = w && LIVE.has(w.status);
  logs.busy = true;
  try {
    // The shown stream first; the other one too, so switching tabs is instant.
    await fetchStream(id, logs.stream, gen);
    await fetchStream(id, logs.stream === 'stdout' ? 'stderr' : 'stdout', gen);
    if (gen === logs.gen) {
      const d = logs.data[logs.stream];
      if (d && !d.text) {
        const pre = $('logs-text');
        pre.classList.add('placeholder');
        pre.textContent = `(nothing on ${logs.stream}${live ? ' yet' : ''})`;
      }
    }
  } catch (err) {
    if (err.status === 401) return;
  } finally {
    logs.busy = false;
  }
  if (gen !== logs.gen) return;
  // Follow a live worker; once it has ended, one last fetch (above) suffices,
  // but keep polling while the state we hold may still be catching up.
  const now = state.workers.get(logs.id);
  if (now && (LIVE.has(now.status) || live)) logs.timer = setTimeout(pollLogs, 1000);
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
  $('logs-close').addEventListener('click', closeLogs);
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
    if (ev.key === 'Escape' && logs.id) closeLogs();
  });
  setInterval(tickAges, 1000);
  // Usage is sampled once a second and changes no state: no event says so,
  // so the running workers are read again every few seconds.
  setInterval(() => {
    if (document.hidden || !state.token) return;
    api('/api/v1/workers?status=running&limit=500')
      .then((r) => r.json())
      .then((body) => body.workers.forEach(upsert))
      .catch(() => {});
  }, 3000);
  // Leases are renewed without events: their state is read every 2 s.
  setInterval(() => {
    if (document.hidden || !state.token) return;
    loadSessions().catch(() => {});
  }, 2000);
  state.token = takeTokenFromUrl();
  boot();
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
}

start();
