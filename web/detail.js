// The worker detail view's content: the worker's fields and its events,
// rendered from the objects the API gave (app.js fetches them and decides
// when). Nothing here calls the API.

import { LIVE, exitText, fmtBytes, fmtNum, outcome, resText } from './format.js';

// A word as a POSIX shell would need it, for showing argv.
function shellWord(s) {
  s = String(s);
  return /^[A-Za-z0-9_./:=@%+,-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`;
}

function argv(list) {
  return (list || []).map(shellWord).join(' ');
}

// The keys of an env-like field: an object ({KEY: value}) or a list of keys.
function keysOf(v) {
  if (!v) return [];
  if (Array.isArray(v)) return v.map(String);
  return Object.keys(v);
}

function text(tag, content, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  e.textContent = content;
  return e;
}

// What the worker runs, as a node: its command line, or its inline code.
function whatItRuns(w) {
  const args = w.args && w.args.length ? ` ${argv(w.args)}` : '';
  if (w.command && w.command.length) return text('code', argv(w.command) + args, 'cmd');
  if (w.script) return text('code', `${w.kernel || 'python3'} ${shellWord(w.script)}${args}`, 'cmd');
  if (w.code) {
    const box = document.createElement('div');
    const shell = w.code.startsWith('!');
    box.append(
      text('span', shell ? 'shell command:' : `code, run with ${w.kernel || 'python3'}${args ? ' (args' + args + ')' : ''}:`, 'muted'),
      text('pre', shell ? w.code.slice(1) : w.code, 'cmd code'),
    );
    return box;
  }
  return text('span', 'nothing: an idle worker (it serves the exec channel until stopped)', 'muted');
}

function usageNode(w) {
  const u = w.usage;
  if (!u) return null;
  const box = document.createElement('div');
  const parts = [`${fmtNum(u.cpu_seconds)} cpu·s`];
  if (LIVE.has(w.status)) parts.push(`${fmtBytes(u.memory_bytes)} now`);
  parts.push(`peak ${fmtBytes(u.memory_peak_bytes)}`);
  box.append(
    text('span', parts.join(' · ')),
    text('span', LIVE.has(w.status)
      ? ' (the latest sample: the controller keeps no series of it)'
      : ' (final: the controller keeps no series of it)', 'muted'),
  );
  return box;
}

// Fills dl with worker w's fields; run is its run's record (or null).
export function renderFields(dl, w, run) {
  dl.textContent = '';
  const add = (label, value, key) => {
    if (value === null || value === undefined || value === '') return;
    const dt = text('dt', label);
    const dd = document.createElement('dd');
    dd.dataset.field = key;
    if (value instanceof Node) dd.appendChild(value);
    else dd.textContent = String(value);
    dl.append(dt, dd);
  };
  const o = outcome(w, run);
  add('Id', text('code', w.id), 'id');
  add('Name', w.name, 'name');
  add('Session', w.session, 'session');
  add('User', w.user, 'user');
  add('Role', w.role, 'role');
  add('Status', o.kind === 'completed' ? `completed (stopped as its run succeeded)` : w.status, 'status');
  if (w.run) add('Run', o.note || w.run, 'run');
  if (w.status === 'scheduling') add('Waiting for', w.waiting_for || 'room (no reason given yet)', 'waiting_for');
  add('Runs', whatItRuns(w), 'command');
  const env = keysOf(w.env);
  add('Env', env.length ? env.join(', ') : null, 'env');
  const secret = keysOf(w.secret_env);
  add('Secret env', secret.length ? `${secret.join(', ')} (values never shown)` : null, 'secret_env');
  add('Resources', resText(w), 'resources');
  add('Usage', usageNode(w), 'usage');
  add('Address', w.ip_address ? `${w.ip_address}${w.hostname ? ' (' + w.hostname + ')' : ''}` : null, 'ip');
  const exit = exitText(w);
  add('Exit', exit ? (w.signal ? `killed by signal ${w.signal}` : `exit code ${exit}`) : null, 'exit');
  add('Failure', w.failure ? text('pre', w.failure, 'failure') : null, 'failure');
  add('Created', w.created_at, 'created_at');
  add('Running since', w.running_at, 'running_at');
  add('Finished', w.finished_at, 'finished_at');
  if (w.attempt > 1) add('Attempt', w.attempt, 'attempt');
}

function clock(at) {
  const d = new Date(at);
  return Number.isNaN(d.getTime()) ? String(at) : d.toLocaleTimeString([], { hour12: false });
}

// Fills ol with the worker's events ({seq, from, to, at, detail}), oldest
// first; truncated: the controller left out older ones; error: why the
// latest read failed (the list, if any, is the one read before).
export function renderEvents(ol, events, truncated = false, error = null) {
  ol.textContent = '';
  if (error) ol.appendChild(text('li', error, 'muted events-error'));
  if (!events) {
    if (!error) ol.appendChild(text('li', 'loading…', 'muted'));
    return;
  }
  if (truncated) ol.appendChild(text('li', `earlier events not shown: the newest ${events.length}`, 'muted events-truncated'));
  if (!events.length) ol.appendChild(text('li', 'no events', 'muted'));
  for (const e of events) {
    const li = document.createElement('li');
    li.dataset.seq = e.seq;
    const time = text('time', clock(e.at));
    time.dateTime = e.at;
    time.title = e.at;
    li.append(time, text('span', e.from ? `${e.from} → ${e.to}` : `→ ${e.to}`, 'move'));
    if (e.detail) li.append(text('span', e.detail, 'why'));
    ol.appendChild(li);
  }
}
