// The log panel of the worker detail: stdout and stderr of one worker,
// fetched by offset and followed while it lives. app.js opens and closes it
// and gives it the API call and each worker's status.

import { LIVE } from './format.js';

const $ = (id) => document.getElementById(id);
let api = null; // app.js's API call: (path) => a Response, or throws
let statusOf = () => undefined; // a worker's status as the page knows it

export function logsInit(apiCall, status) {
  api = apiCall;
  statusOf = status;
}

const MAX_LOG_CHARS = 1 << 20; // keep the last 1 Mi characters on the page

export const logs = {
  id: null,
  stream: 'stdout',
  data: {}, // stream -> {offset, text, decoder}
  timer: null,
  busy: false,
  again: false, // a poll was asked for while one ran
  gen: 0,
  abort: null, // the AbortController of this generation's fetches
};

// A new generation: the fetches of the last one are abandoned (a worker's
// first fetch can read megabytes), and their answers are ignored.
function nextGen() {
  logs.gen++;
  if (logs.abort) logs.abort.abort();
  logs.abort = new AbortController();
}

// Shows worker id's logs (from the start when it is another worker).
export function logsOpen(id) {
  if (logs.id === id) return;
  logs.id = id;
  nextGen();
  logs.data = {};
  $('logs-text').textContent = '';
}

export function logsClose() {
  logs.id = null;
  nextGen();
  clearTimeout(logs.timer);
}

export function selectTab(stream, poll = true) {
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
    { signal: logs.abort.signal },
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

export async function pollLogs() {
  clearTimeout(logs.timer);
  if (!logs.id) return;
  // One poll at a time; one asked for meanwhile runs when it ends.
  if (logs.busy) {
    logs.again = true;
    return;
  }
  logs.again = false;
  const gen = logs.gen;
  const id = logs.id;
  const live = LIVE.has(statusOf(id));
  let failed = false;
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
    // (a 404: the worker is gone, there is nothing to wait for)
    failed = gen === logs.gen && err.status !== 404;
  } finally {
    logs.busy = false;
  }
  // Another worker (or none) since this poll began, or a poll asked for
  // while this one ran: the poll it could not start (busy) starts now.
  if (gen !== logs.gen || logs.again) {
    if (logs.id) pollLogs();
    return;
  }
  // The controller away or failing: ask again shortly, whatever the status.
  if (failed) {
    logs.timer = setTimeout(pollLogs, 2000);
    return;
  }
  // Follow a live worker; once it has ended, one last fetch (above) suffices,
  // but keep polling while the state we hold may still be catching up.
  const now = statusOf(logs.id);
  if (now && (LIVE.has(now) || live)) logs.timer = setTimeout(pollLogs, 1000);
}
