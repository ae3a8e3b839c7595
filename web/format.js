// Formatting shared by the worker list (app.js) and the worker detail
// (detail.js): numbers, sizes, durations, a worker's resources and exit.

export const LIVE = new Set(['scheduling', 'starting', 'running']);

// precise: tenths of a second under 10 s (run durations); ages tick in seconds.
export function fmtDuration(ms, precise = false) {
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

export function fmtNum(v) {
  if (v === null || v === undefined) return '–';
  return String(Math.round(v * 100) / 100);
}

export function fmtBytes(b) {
  if (b === null || b === undefined || b < 0) return '–';
  if (b < 1024 * 1024) return `${Math.round(b / 1024)} KiB`;
  if (b < 1024 * 1024 * 1024) return `${Math.round(b / (1024 * 1024))} MiB`;
  return `${(b / (1024 * 1024 * 1024)).toFixed(1)} GiB`;
}

export function resText(w) {
  let s = `${fmtNum(w.cpu)} cpu · ${fmtNum(w.memory)} GiB`;
  if (w.nvidia_gpu) s += ` · ${w.nvidia_gpu} gpu`;
  return s;
}

export function exitText(w) {
  if (w.exit_code !== null && w.exit_code !== undefined) return String(w.exit_code);
  if (w.signal) return `sig ${w.signal}`;
  return '';
}

// How a stopped worker of a run ended, from its run's record (null while
// unknown): the run's own end stops its workers, which is no abort.
// Returns {label, note, kind}: the badge text, a sentence, and
// 'completed' (stopped as its run succeeded), 'aborted' (stopped while or
// as its run failed or was stopped, or stopped in an attempt that a
// restart replaced) or '' (no run, or not stopped).
//
// Only the workers of the run's last attempt are stopped by its end. A
// restart is recorded (in run.causes, with its time) after the attempt's
// workers were stopped and before the next attempt's workers are
// launched, so a worker created before the last restart's time belongs to
// an earlier attempt: it was stopped by that restart (or by the user, a
// lease), whatever became of the run.
export function outcome(w, run) {
  if (!w.run) return { label: w.status, note: '', kind: '' };
  if (!run || !run.status) return { label: w.status, note: `run ${w.run}`, kind: '' };
  const note = run.status === 'running' ? `run ${w.run} running` : `run ${w.run} ${run.status}`;
  if (w.status !== 'stopped') return { label: w.status, note, kind: '' };
  const created = Date.parse(w.created_at);
  const causes = run.causes || [];
  const before = causes.filter((c) => !(Date.parse(c.at) <= created)).length; // restarts after its launch
  if (before > 0) {
    const k = causes.length - before + 1; // the restart that replaced its attempt
    return { label: 'stopped', note: `aborted: replaced by restart ${k} of run ${w.run} (${run.status})`, kind: 'aborted' };
  }
  if (run.status === 'succeeded') {
    return { label: 'completed', note: `stopped as run ${w.run} succeeded`, kind: 'completed' };
  }
  // Its run may yet record its end (a client stops the workers first).
  if (run.status === 'running') return { label: 'stopped', note, kind: '' };
  return { label: 'stopped', note: `aborted: run ${w.run} ${run.status}`, kind: 'aborted' };
}

// What a worker's launcher or its own code set (its name, its failure, the
// host it reported) with its control characters written out (\x1b, \n,
// C1 controls as \u0080...): nothing it holds hides in the page or passes
// for another line. A failure keeps its lines (its stderr's tail).
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;
const CONTROL_AND_LINES = /[\u0000-\u001f\u007f-\u009f]/g;

export function visible(s, keepLines = false) {
  if (typeof s !== 'string') return s;
  return s.replace(keepLines ? CONTROL : CONTROL_AND_LINES, (c) => {
    const n = c.charCodeAt(0);
    if (c === '\n') return '\\n';
    if (c === '\t') return '\\t';
    if (c === '\r') return '\\r';
    return n < 0x80 ? `\\x${n.toString(16).padStart(2, '0')}` : `\\u${n.toString(16).padStart(4, '0')}`;
  });
}

const SHOWN = ['name', 'role', 'session', 'user', 'hostname', 'ip_address', 'script', 'code', 'kernel',
  'waiting_for', 'backend_ref', 'cwd', 'path'];

// A copy of worker w whose strings are visible().
export function visibleWorker(w) {
  if (!w || typeof w !== 'object') return w;
  const v = { ...w };
  for (const k of SHOWN) v[k] = visible(w[k]);
  v.failure = visible(w.failure, true);
  return v;
}
