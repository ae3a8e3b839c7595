// Browser tests of muster's web UI (web/): Debian's chromium driven by
// playwright-core, against a real controller with real workers.
//
//   node tests/web/test_web.mjs BUILD_DIR
//
// MUSTER_WEB_SCREENSHOT=1 also writes docs/web-ui.png (1280x800, a dozen
// workers in mixed states); otherwise the screenshots go to a temp dir,
// kept (with the controller's log) on failure or with MUSTER_WEB_KEEP=1.

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');

const buildDir = path.resolve(process.argv[2] || path.join(repo, 'build'));
const controllerBin = path.join(buildDir, 'muster-controller');
const CHROMIUM = process.env.MUSTER_CHROMIUM || '/usr/bin/chromium';
const T = 15000; // every wait is bounded by this

let chromium;
try {
  ({ chromium } = require('playwright-core'));
} catch (e) {
  console.log(`not ok - playwright-core is not installed (npm ci --prefix tests/web): ${e.message}`);
  process.exit(1);
}
for (const f of [controllerBin, CHROMIUM]) {
  if (!fs.existsSync(f)) {
    console.log(`not ok - ${f} is missing`);
    process.exit(1);
  }
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'muster-web-'));
fs.chmodSync(tmp, 0o755); // the workers' directory: their account (muster-worker) enters it
const stateDir = path.join(tmp, 'state');
const shotDir = path.join(tmp, 'shots');
fs.mkdirSync(stateDir);
fs.mkdirSync(shotDir);

let passed = 0;
let failed = 0;
function ok(cond, what, extra) {
  if (cond) {
    passed++;
    console.log(`ok - ${what}`);
  } else {
    failed++;
    console.log(`not ok - ${what}${extra ? `\n#   ${String(extra).replace(/\n/g, '\n#   ')}` : ''}`);
  }
  return cond;
}
async function step(what, fn) {
  try {
    await fn();
  } catch (e) {
    ok(false, what, e && e.stack ? e.stack.split('\n').slice(0, 4).join('\n') : e);
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(fn, what, ms = T) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what} (last: ${last})`);
}

// ---------- the controller ----------

let ctl = null;
let baseUrl = null;
let token = null;
let port = 0;
const allWorkerPids = new Set();

async function startController() {
  const urlFile = path.join(stateDir, 'url');
  fs.rmSync(urlFile, { force: true });
  const listen = `127.0.0.1:${port}`;
  const log = fs.openSync(path.join(tmp, 'controller.log'), 'a');
  const child = spawn(
    controllerBin,
    ['--listen', listen, '--state-dir', stateDir, '--web-dir', path.join(repo, 'web'), '--network', 'host',
      '--heartbeat-interval', '0.5', '--cpus', '4', '--memory', '16'],
    { cwd: tmp, stdio: ['ignore', log, log] },
  );
  fs.closeSync(log);
  child.exited = new Promise((res) => child.on('exit', (code, sig) => res({ code, sig })));
  ctl = child;
  const url = await until(() => {
    if (child.exitCode !== null) throw new Error(`controller exited ${child.exitCode}`);
    return fs.existsSync(urlFile) && fs.readFileSync(urlFile, 'utf8').trim();
  }, 'the controller url file');
  baseUrl = url.replace(/\/$/, '');
  port = Number(new URL(baseUrl).port);
  token = fs.readFileSync(path.join(stateDir, 'token'), 'utf8').trim();
  await until(async () => (await fetch(`${baseUrl}/api/v1/health`)).ok, 'health');
}

async function stopController() {
  if (!ctl || ctl.exitCode !== null) return;
  ctl.kill('SIGTERM');
  const r = await Promise.race([ctl.exited, sleep(T).then(() => null)]);
  if (!r) {
    ctl.kill('SIGKILL');
    await ctl.exited;
  }
}

async function api(method, p, body) {
  const r = await fetch(`${baseUrl}${p}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${p}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function launch(spec) {
  const r = await api('POST', '/api/v1/workers', { n: 1, cpu: 0.5, memory: 0.25, ...spec });
  return r.workers.length === 1 ? r.workers[0] : r.workers;
}

async function getWorker(id) {
  const w = await api('GET', `/api/v1/workers/${id}`);
  return w;
}

// ---------- the page ----------

const rowSel = (id) => `#rows tr[data-id="${id}"]`;

async function rowStatus(page, id, status) {
  await page.waitForSelector(`${rowSel(id)}[data-status="${status}"]`, { state: 'attached', timeout: T });
}

async function main() {
  await startController();
  const userData = path.join(tmp, 'chromium-profile');
  // (a browser that does not start still leaves nothing running: the
  // controller is stopped and its workers killed before the error goes on)
  const context = await chromium.launchPersistentContext(userData, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 800 },
    // (Chromium's own start: on a loaded 2-core machine it has taken more
    // than 15 s, with nothing of muster's in the way)
    timeout: 4 * T,
  }).catch(async (e) => {
    await cleanup(null);
    throw e;
  });
  context.setDefaultTimeout(T);
  const page = context.pages()[0] || (await context.newPage());
  const pageErrors = [];
  let restarting = false; // the controller is being restarted on purpose
  let expectedErrors = null; // a regexp: error answers a step provokes on purpose
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  // Connection refused is expected while the controller restarts (step 5).
  // So is a 503 while it shuts down: "shutting down" is the controller's
  // answer then, and the page retries.
  page.on('console', (m) => {
    const expected = m.text().includes('ERR_CONNECTION_REFUSED') ||
      (restarting && m.text().includes('status of 503')) ||
      (expectedErrors !== null && expectedErrors.test(m.text()));
    if (m.type() === 'error' && !expected) pageErrors.push(m.text());
  });
  // An error answer names its request, so a failure says which one.
  page.on('response', (r) => {
    if (r.status() >= 400) console.log(`# ${r.status()} ${r.request().method()} ${r.url().replace(/(token=)[^&]*/, '$1...')}`);
  });
  let refused = 0; // the page's requests that found nobody listening (step 5)
  page.on('requestfailed', (r) => {
    if (!r.url().startsWith(baseUrl)) pageErrors.push(`request outside the controller: ${r.url()}`);
    else if ((r.failure()?.errorText || '').includes('ERR_CONNECTION_REFUSED')) refused++;
  });
  page.on('request', (r) => {
    if (!r.url().startsWith(baseUrl) && !r.url().startsWith('data:')) pageErrors.push(`request outside the controller: ${r.url()}`);
  });
  let loads = 0;
  page.on('load', () => loads++);

  try {
    // 0. The controller side: access_token works on the event stream only.
    await step('access_token is accepted on /api/v1/events only', async () => {
      const ctrl = new AbortController();
      const good = await fetch(`${baseUrl}/api/v1/events?since=0&access_token=${token}`, { signal: ctrl.signal });
      ok(good.status === 200 && (good.headers.get('content-type') || '').startsWith('text/event-stream'),
        `GET /api/v1/events?access_token=<token> is accepted (${good.status})`);
      ctrl.abort();
      const bad = await fetch(`${baseUrl}/api/v1/events?since=0&access_token=${token}x`);
      ok(bad.status === 401, `a wrong access_token is refused (${bad.status})`);
      const list = await fetch(`${baseUrl}/api/v1/workers?access_token=${token}`);
      ok(list.status === 401, `access_token is refused on other calls (${list.status})`);
      const post = await fetch(`${baseUrl}/api/v1/events?access_token=${token}`, { method: 'POST' });
      ok(post.status === 401, `access_token is refused on POST /api/v1/events (${post.status})`);
    });

    // 1. No token: the sign-in hint.
    await step('without a token the page shows the sign-in hint', async () => {
      await page.goto(`${baseUrl}/`);
      await page.waitForSelector('#signin', { state: 'visible' });
      const text = await page.textContent('#signin');
      ok(text.includes('Open the link the controller printed') && text.includes('/?token='),
        'without a token the page shows the sign-in hint', text);
      ok(await page.isHidden('#workers'), 'without a token no worker table is shown');
      // The hint names this controller's token file (its --state-dir), not a default.
      const tokenFile = path.join(fs.realpathSync(stateDir), 'token');
      await page.waitForFunction((f) => document.getElementById('signin-url').textContent.includes(f), tokenFile)
        .catch(() => {});
      const hint = await page.textContent('#signin-url');
      ok(hint.includes(tokenFile) && !hint.includes('~/.muster/token'),
        `the sign-in hint names the controller's own token file (${tokenFile})`, hint);
      await page.screenshot({ path: path.join(shotDir, 'web-ui-signin.png') });
    });

    // 2. With ?token=: the table; workers launched afterwards appear and finish, live.
    let pageId;
    let loadsAfterSignin;
    await step('with ?token= the table loads', async () => {
      const early = await launch({ name: 'before-page', code: 'print(1)' });
      await page.goto(`${baseUrl}/?token=${token}`);
      await page.waitForSelector('#workers', { state: 'visible' });
      await page.waitForSelector(rowSel(early.id), { state: 'attached' });
      ok(!page.url().includes('token='), 'the token is removed from the address bar', page.url());
      ok((await page.evaluate(() => localStorage.getItem('muster.token'))) === token,
        'the token is kept in localStorage');
      await page.waitForSelector('#conn[data-state="live"]');
      ok(true, 'with ?token= the table loads and the event stream is live');
      pageId = await page.evaluate(() => window.__musterPageId);
      loadsAfterSignin = loads;
      // Record every status a row shows, to see the live transitions.
      await page.evaluate(() => {
        window.__seen = {};
        const note = (tr) => {
          const id = tr.dataset.id;
          const s = tr.dataset.status;
          const l = (window.__seen[id] = window.__seen[id] || []);
          if (l[l.length - 1] !== s) l.push(s);
        };
        const tbody = document.getElementById('rows');
        for (const tr of tbody.children) note(tr);
        new MutationObserver((ms) => {
          for (const m of ms) {
            if (m.type === 'attributes' && m.target.tagName === 'TR') note(m.target);
            for (const n of m.addedNodes || []) if (n.tagName === 'TR') note(n);
          }
        }).observe(tbody, { subtree: true, childList: true, attributes: true, attributeFilter: ['data-status'] });
      });
    });

    await step('launched workers appear and finish without a reload', async () => {
      const sleeper = await launch({ name: 'sleeper', code: 'import time; time.sleep(1)' });
      // It says why on its stderr, as a traceback would, in two lines.
      const exiter = await launch({
        name: 'exiter',
        code: 'import sys; print("reading input", file=sys.stderr); print("bad input: 7", file=sys.stderr); sys.exit(3)',
      });
      await page.waitForSelector(rowSel(sleeper.id), { state: 'attached' });
      await page.waitForSelector(rowSel(exiter.id), { state: 'attached' });
      ok(true, 'workers launched through the API appear on the page');
      await rowStatus(page, sleeper.id, 'succeeded');
      const seen = await page.evaluate((id) => window.__seen[id], sleeper.id);
      ok(seen && seen.some((s) => s === 'starting' || s === 'running') && seen[seen.length - 1] === 'succeeded',
        `the sleeper went from starting/running to succeeded (${seen && seen.join(' → ')})`);
      await rowStatus(page, exiter.id, 'failed');
      const api3 = await getWorker(exiter.id);
      // (the status comes with the event; the exit code and the failure
      // with the row's refetch just after it)
      const cell = (c) => page.textContent(`${rowSel(exiter.id)} ${c}`).then((t) => t.trim());
      const exitText = await until(async () => (await cell('.c-exit')) || false, 'the failed worker\'s exit code on its row')
        .catch(() => cell('.c-exit'));
      const failText = await until(async () => (await cell('.c-failure')) || false, 'the failed worker\'s failure on its row')
        .catch(() => cell('.c-failure'));
      ok(exitText === '3', `the failed worker shows exit code 3 (got "${exitText}")`);
      const failTitle = await page.getAttribute(`${rowSel(exiter.id)} .c-failure`, 'title');
      ok(api3.failure === 'the script exited with code 3; its stderr ended with:\nreading input\nbad input: 7',
        `its failure quotes the last lines of its stderr (${JSON.stringify(api3.failure)})`);
      ok(failText === 'the script exited with code 3; its stderr ended with: bad input: 7',
        `its row shows the failure sentence and the last stderr line on one line ("${failText}")`);
      ok(failTitle === api3.failure, `the cell's tooltip holds the whole failure (${JSON.stringify(failTitle)})`);
      const badge = await page.textContent(`${rowSel(exiter.id)} .badge`);
      ok(badge.trim() === 'failed', 'its badge reads failed');
      const counts = await page.textContent('#counts .count.s-failed .n');
      ok(Number(counts) >= 1, 'the failed count at the top counts it');
      ok((await page.evaluate(() => window.__musterPageId)) === pageId && loads === loadsAfterSignin,
        'no reload happened (same page marker, no load event)');
    });

    // 3. Stop button on an idle worker.
    await step('the stop button stops an idle worker', async () => {
      const idle = await launch({ name: 'idle-stop-me' });
      await rowStatus(page, idle.id, 'running');
      // The status shows at once; the details (the IP) come with the
      // worker object fetched after the event.
      await page.waitForFunction((sel) => (document.querySelector(sel)?.textContent || '').trim() !== '',
        `${rowSel(idle.id)} .c-ip`, { timeout: T }).catch(() => {});
      const ip = (await page.textContent(`${rowSel(idle.id)} .c-ip`)).trim();
      ok(/^\d+\.\d+\.\d+\.\d+$/.test(ip), `a running worker shows its IP address (${ip})`);
      // What it uses, beside what it asked for (sampled from its cgroup,
      // where the controller isolates workers).
      const health = await (await fetch(`${baseUrl}/api/v1/health`)).json();
      if (health.isolation === 'cgroup') {
        await page.waitForFunction((sel) => /^uses [0-9.]+ cpu(·s)? · [0-9.]+ [KMG]iB$/.test(
          document.querySelector(sel)?.textContent || ''), `${rowSel(idle.id)} .c-res .use`, { timeout: T });
        const use = (await page.textContent(`${rowSel(idle.id)} .c-res .use`)).trim();
        ok(true, `a running worker shows what it uses beside its request ("${use}")`);
      } else {
        ok(true, `# SKIP usage: the controller isolates no workers here (isolation ${health.isolation})`);
      }
      let dialogText = null;
      page.once('dialog', (d) => {
        dialogText = d.message();
        d.accept();
      });
      await page.click(`${rowSel(idle.id)} button.stop`);
      await rowStatus(page, idle.id, 'stopped');
      ok(dialogText && dialogText.includes(idle.id), `a confirm dialog asked first ("${dialogText}")`);
      ok((await getWorker(idle.id)).status === 'stopped', 'the stop button stops an idle worker; the row shows stopped');
      ok(await page.isHidden(`${rowSel(idle.id)} button.stop`), 'a stopped worker has no stop button');
      ok(await page.isHidden('#logs'), 'the stop click did not open the logs panel');
    });

    // 3a. A session's lease, as the strip of live sessions shows it.
    await step('a leased session shows its lease', async () => {
      await api('PUT', '/api/v1/sessions/web-leased/lease', { ttl_seconds: 60 });
      const w = await launch({ name: 'leased', session: 'web-leased' });
      await rowStatus(page, w.id, 'running');
      const sel = '#sessions li[data-session="web-leased"]';
      await page.waitForFunction((s) => /^web-leased1 livelease: \d+ s left of 60 s$/.test(
        document.querySelector(s)?.textContent || ''), sel, { timeout: T });
      ok(true, `the session strip shows "${(await page.textContent(sel)).trim()}"`);
      await api('DELETE', '/api/v1/sessions/web-leased/lease');
      await page.waitForFunction((s) => /no lease$/.test(document.querySelector(s)?.textContent || ''),
        sel, { timeout: T });
      ok(true, 'once the lease is given back, it says "no lease"');
      await api('DELETE', `/api/v1/workers/${w.id}`);
      await rowStatus(page, w.id, 'stopped');
      await page.waitForSelector(sel, { state: 'detached', timeout: T });
      ok(true, 'a session with no live worker and no lease leaves the strip');
    });

    // 3b. Dismissing the confirm dialog leaves the worker running.
    await step('dismissing the confirm dialog keeps the worker', async () => {
      const idle = await launch({ name: 'idle-keep' });
      await rowStatus(page, idle.id, 'running');
      // The page's only way to stop a worker is a DELETE through fetch(),
      // called in the same task as the confirm dialog: count those.
      await page.evaluate(() => {
        window.__deletes = 0;
        window.__fetch = window.fetch;
        window.fetch = (input, opts) => {
          if (opts && opts.method === 'DELETE') window.__deletes++;
          return window.__fetch.call(window, input, opts);
        };
      });
      let dismissed = false;
      page.once('dialog', (d) => {
        dismissed = true;
        d.dismiss();
      });
      await page.click(`${rowSel(idle.id)} button.stop`);
      await until(() => dismissed, 'the confirm dialog (to dismiss it)');
      // The click's handler ran to its end before this evaluate runs: had it
      // gone on past the dialog, its DELETE would be counted by now.
      const deletes = await page.evaluate(() => {
        window.fetch = window.__fetch;
        return window.__deletes;
      });
      ok(deletes === 0 && (await getWorker(idle.id)).status === 'running',
        `dismissing the confirm dialog keeps the worker running (${deletes} DELETE sent)`);
      await api('DELETE', `/api/v1/workers/${idle.id}`);
      await rowStatus(page, idle.id, 'stopped');
    });

    // 4. Logs of a finished worker, both streams, from the mouse and the keyboard.
    await step('clicking a finished worker shows its logs', async () => {
      const w = await launch({
        name: 'talker',
        code: 'import sys\nprint("hello from the muster web test")\nprint("a warning on stderr", file=sys.stderr)',
      });
      await rowStatus(page, w.id, 'succeeded');
      await page.click(`${rowSel(w.id)} .c-id`);
      await page.waitForSelector('#logs', { state: 'visible' });
      await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('hello from the muster web test'));
      ok(true, 'clicking a finished worker shows its stdout');
      await page.click('#tab-stderr');
      await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('a warning on stderr'));
      ok(true, 'the stderr tab shows its stderr');
      await page.screenshot({ path: path.join(shotDir, 'web-ui-logs.png') });
      await page.keyboard.press('Escape');
      await page.waitForSelector('#logs', { state: 'hidden' });
      // Keyboard: focus the row, press Enter.
      await page.focus(rowSel(w.id));
      await page.keyboard.press('Enter');
      await page.waitForSelector('#logs', { state: 'visible' });
      ok(true, 'Enter on a focused row opens its logs');
      await page.keyboard.press('Escape');
      await page.waitForSelector('#logs', { state: 'hidden' });
    });

    await step('the logs of a running worker are followed', async () => {
      const w = await launch({
        name: 'follower',
        code: 'import time\nfor i in range(30):\n    print("tick", i, flush=True)\n    time.sleep(0.2)',
      });
      await rowStatus(page, w.id, 'running');
      await page.click(`${rowSel(w.id)} .c-id`);
      await page.click('#tab-stdout');
      await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('tick 2'));
      await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('tick 29'));
      ok(true, 'an open logs panel follows a running worker to its end');
      const text = await page.textContent('#logs-text');
      const ticks = text.split('\n').filter((l) => l.startsWith('tick '));
      ok(ticks.length === 30 && ticks.every((l, i) => l === `tick ${i}`), 'every line once, in order', ticks.join('|'));
      await page.keyboard.press('Escape');
    });

    // 5. Controller restart: the page reconnects and keeps up.
    await step('the page keeps up after a controller restart', async () => {
      restarting = true;
      await stopController();
      await page.waitForSelector('#conn[data-state="down"]');
      ok(true, 'the indicator shows the lost connection');
      // The page retries while nobody listens: wait for a refused try.
      const refusedBefore = refused;
      await until(() => refused > refusedBefore, 'the page to retry and be refused while the controller is down');
      await startController();
      const w = await launch({ name: 'after-restart' });
      // Back and live: every answer of the old controller (a 503 while it
      // shut down) reached the page before this.
      await page.waitForSelector('#conn[data-state="live"]');
      restarting = false;
      await page.waitForSelector(rowSel(w.id), { state: 'attached' });
      await rowStatus(page, w.id, 'running');
      ok(true, 'a worker launched after the restart appears and reaches running');
      ok((await page.evaluate(() => window.__musterPageId)) === pageId && loads === loadsAfterSignin,
        'no reload happened across the restart');
      await api('DELETE', `/api/v1/workers/${w.id}`);
      await rowStatus(page, w.id, 'stopped');
    });

    // 5a. A worker's detail, reached by its deep link in a fresh page load.
    await step('a failed worker\'s detail opens from its deep link', async () => {
      const w = await launch({
        name: 'deep-failer',
        code: 'import sys\nprint("deep link: the last words", file=sys.stderr)\nsys.exit(3)',
        env: { DEEP_PLAIN: 'visible-value' },
        secret_env: { DEEP_SECRET: 'hunter2-never-shown' },
      });
      await until(async () => (await getWorker(w.id)).status === 'failed', `${w.id} to fail`);
      const api3 = await getWorker(w.id);
      const events = await api('GET', `/api/v1/workers/${w.id}/events`);
      ok(events.worker_id === w.id && events.events.length >= 2 && events.events.at(-1).to === 'failed',
        `GET /api/v1/workers/ID/events lists its changes (${events.events.map((e) => e.to).join(', ')})`);
      const none = await fetch(`${baseUrl}/api/v1/workers/w-0000000000/events`, { headers: { Authorization: `Bearer ${token}` } });
      ok(none.status === 404, `the events of no such worker are a 404 (${none.status})`);
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/#/workers/${w.id}`);
      await page.waitForSelector('#detail', { state: 'visible' });
      const field = (k) => page.textContent(`#detail-fields dd[data-field="${k}"]`).catch(() => null);
      await page.waitForFunction((id) => document.querySelector('#detail-fields dd[data-field="id"]')?.textContent === id, w.id);
      ok(true, `#/workers/${w.id} opens that worker's detail on a fresh load`);
      const cmd = await field('command');
      ok(cmd && cmd.includes('sys.exit(3)'), `the detail shows what the worker runs ("${cmd}")`);
      const failure = await field('failure');
      ok(failure === api3.failure, `the detail shows its whole failure ("${failure}")`, api3.failure);
      const env = await field('env');
      const secret = await field('secret_env');
      ok(env && env.includes('DEEP_PLAIN') && secret && secret.includes('DEEP_SECRET'),
        `the detail shows env and secret_env keys ("${env}", "${secret}")`);
      const html = await page.content();
      ok(!html.includes('hunter2-never-shown') && !html.includes('visible-value'),
        'no env or secret_env value is anywhere on the page');
      await page.waitForFunction(() => [...document.querySelectorAll('#detail-events li')]
        .some((li) => li.textContent.includes('→ failed')));
      const shown = await page.$$eval('#detail-events li', (lis) => lis.map((li) => li.textContent));
      ok(shown.some((e) => e.includes('→ scheduling')) && shown.some((e) => e.includes('→ failed')),
        `the detail lists the worker's events (${shown.join(' | ')})`);
      await page.click('#tab-stderr');
      await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('deep link: the last words'));
      ok(true, 'its log panel shows its stderr');
      await page.click('#tab-stdout');
      await page.screenshot({ path: path.join(shotDir, 'web-ui-detail.png') });
    });

    await step('opening a row changes the address; back and forward follow', async () => {
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/`);
      await page.waitForSelector('#rows tr', { state: 'attached' });
      const a = await launch({ name: 'route-a', code: 'print("a")' });
      await rowStatus(page, a.id, 'succeeded');
      await page.click(`${rowSel(a.id)} .c-id`);
      await page.waitForSelector('#detail', { state: 'visible' });
      ok(page.url().endsWith(`#/workers/${a.id}`), `the address names the open worker (${page.url()})`);
      await page.goBack();
      await page.waitForSelector('#detail', { state: 'hidden' });
      ok(!page.url().includes('/workers/'), `back closes the detail (${page.url()})`);
      await page.goForward();
      await page.waitForSelector('#detail', { state: 'visible' });
      await page.waitForFunction((id) => document.querySelector('#detail-fields dd[data-field="id"]')?.textContent === id, a.id);
      ok(true, 'forward opens it again');
      await page.keyboard.press('Escape');
      await page.waitForSelector('#detail', { state: 'hidden' });
    });

    await step('a deep link to no such worker says there is none', async () => {
      expectedErrors = /status of 404/;
      try {
        await page.goto('about:blank');
        await page.goto(`${baseUrl}/#/workers/w-0000000000`);
        await page.waitForSelector('#detail', { state: 'visible' });
        await page.waitForFunction(() => document.getElementById('detail-fields').textContent
          .includes('There is no worker w-0000000000'));
        ok(true, '#/workers/w-0000000000 says "There is no worker w-0000000000"');
        // A malformed id, HTML included: shown as text, never as markup.
        await page.evaluate(() => { location.hash = '#/workers/%3Cimg%20src%3Dx%20onerror%3D%22window.__xss%3D1%22%3E'; });
        await page.waitForFunction(() => document.getElementById('detail-fields').textContent
          .includes('There is no worker <img src=x onerror="window.__xss=1">'));
        ok(await page.evaluate(() => window.__xss === undefined && !document.querySelector('#detail img')),
          'a malformed id in the address is named as text, and runs nothing');
        ok(await page.isHidden('#logs'), 'no log panel for a worker that is not there');
        await page.keyboard.press('Escape');
        await page.waitForSelector('#detail', { state: 'hidden' });
      } finally {
        expectedErrors = null;
      }
    });

    await step('a detail opened while the controller fails recovers by itself', async () => {
      const w = await launch({ name: 'flaky-open', code: 'print("read after the 503")' });
      await rowStatus(page, w.id, 'succeeded');
      let refusedOnce = 0;
      const only = (u) => u.pathname === `/api/v1/workers/${w.id}`;
      await page.route(only, (route) => {
        if (refusedOnce++ === 0) {
          return route.fulfill({ status: 503, contentType: 'application/json',
            body: '{"error": {"code": "shutting_down", "message": "shutting down"}}' });
        }
        return route.continue();
      });
      expectedErrors = /status of 503/;
      try {
        await page.click(`${rowSel(w.id)} .c-id`);
        await page.waitForSelector('#detail', { state: 'visible' });
        await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('read after the 503'));
        await page.waitForFunction(() => [...document.querySelectorAll('#detail-events li')]
          .some((li) => li.textContent.includes('→ succeeded')));
        ok(refusedOnce >= 2, `after a 503 on opening, the detail reads the worker again and shows its events and logs (${refusedOnce} reads)`);
      } finally {
        expectedErrors = null;
        await page.unroute(only);
      }
      await page.keyboard.press('Escape');
      await page.waitForSelector('#detail', { state: 'hidden' });
    });

    await step('switching quickly to another worker shows that worker\'s logs', async () => {
      const a = await launch({ name: 'switch-from', code: 'print("the first worker\'s log")' });
      const b = await launch({ name: 'switch-to', code: 'print("the second worker\'s log")' });
      await rowStatus(page, a.id, 'succeeded');
      await rowStatus(page, b.id, 'succeeded');
      // A's log read is still on its way (a big log) when the user opens B.
      let release;
      const released = new Promise((res) => { release = res; });
      let held;
      const holding = new Promise((res) => { held = res; });
      const aLogs = (u) => u.pathname === `/api/v1/workers/${a.id}/logs`;
      await page.route(aLogs, async (route) => {
        held();
        await released;
        try {
          await route.continue();
        } catch (_) { /* the page gave it up */ }
      });
      try {
        await page.click(`${rowSel(a.id)} .c-id`);
        await holding;
        await page.click(`${rowSel(b.id)} .c-id`);
        await page.waitForFunction((id) => document.querySelector('#detail-fields dd[data-field="id"]')?.textContent === id, b.id);
        release();
        await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('the second worker\'s log'));
        ok(!(await page.textContent('#logs-text')).includes('the first worker\'s log'),
          'after a quick switch, the second worker\'s logs load (and only its)');
      } finally {
        release();
        await page.unroute(aLogs);
      }
      await page.keyboard.press('Escape');
      await page.waitForSelector('#detail', { state: 'hidden' });
    });

    await step('a refused token closes the detail; signing in again reloads it', async () => {
      const w = await launch({ name: 'resign', code: 'print("shown after signing in again")' });
      await rowStatus(page, w.id, 'succeeded');
      let refusedOnce = 0;
      const evs = (u) => u.pathname === `/api/v1/workers/${w.id}/events`;
      await page.route(evs, (route) => (refusedOnce++ === 0
        ? route.fulfill({ status: 401, contentType: 'application/json', body: '{"error": {"code": "unauthorized", "message": "unauthorized"}}' })
        : route.continue()));
      expectedErrors = /status of 401/;
      try {
        await page.click(`${rowSel(w.id)} .c-id`);
        await page.waitForSelector('#signin', { state: 'visible' });
        await page.waitForSelector('#detail', { state: 'hidden' });
        ok(true, 'the sign-in page does not keep a worker\'s detail beside it');
        await page.fill('#signin-token', token);
        await page.press('#signin-token', 'Enter');
        await page.waitForSelector('#detail', { state: 'visible' });
        await page.waitForFunction(() => [...document.querySelectorAll('#detail-events li')]
          .some((li) => li.textContent.includes('→ succeeded')));
        await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('shown after signing in again'));
        ok(true, 'signing in again reads the open worker afresh: its events and logs');
      } finally {
        expectedErrors = null;
        await page.unroute(evs);
      }
      await page.keyboard.press('Escape');
      await page.waitForSelector('#detail', { state: 'hidden' });
    });

    await step('the open detail and its logs leave every Stop button clickable', async () => {
      const idle = await launch({ name: 'stop-beside-logs' });
      const talker = await launch({ name: 'logs-beside-stop', code: 'print("next to a stop button")' });
      try {
        await rowStatus(page, idle.id, 'running');
        await rowStatus(page, talker.id, 'succeeded');
        await page.click(`${rowSel(talker.id)} .c-id`);
        await page.waitForSelector('#logs', { state: 'visible' });
        await page.waitForFunction(() => document.getElementById('logs-text').textContent.includes('next to a stop button'));
        const sel = `${rowSel(idle.id)} button.stop`;
        await page.waitForSelector(sel, { state: 'visible' });
        const hit = await page.$eval(sel, (b) => {
          b.scrollIntoView({ block: 'center', inline: 'center' });
          const r = b.getBoundingClientRect();
          const at = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
          return { on: at === b || b.contains(at), what: at ? `${at.tagName}#${at.id}.${at.className}` : 'nothing', x: r.left };
        });
        ok(hit.on, `a running worker's Stop button is not covered by the open logs (at x=${Math.round(hit.x)}: ${hit.what})`);
        await page.keyboard.press('Escape');
        await page.waitForSelector('#detail', { state: 'hidden' });
      } finally {
        await api('DELETE', `/api/v1/workers/${idle.id}`);
      }
      await rowStatus(page, idle.id, 'stopped');
    });

    await step('the search box narrows the list to matching ids and names', async () => {
      const a = await launch({ name: 'needle-alpha', code: 'print(1)' });
      const b = await launch({ name: 'needle-beta', code: 'print(2)' });
      await page.waitForSelector(rowSel(a.id), { state: 'attached' });
      await page.waitForSelector(rowSel(b.id), { state: 'attached' });
      await page.fill('#search', 'needle-al');
      await page.waitForFunction(() => document.querySelectorAll('#rows tr:not([hidden])').length === 1);
      const shown = await page.$$eval('#rows tr:not([hidden])', (trs) => trs.map((t) => t.dataset.id));
      ok(shown.length === 1 && shown[0] === a.id, `searching a name shows only that worker (${shown.join(', ')})`);
      ok(page.url().includes('q=needle-al'), `the search is in the address (${page.url()})`);
      await page.fill('#search', b.id.slice(0, 8));
      await page.waitForFunction((id) => [...document.querySelectorAll('#rows tr:not([hidden])')].some((t) => t.dataset.id === id), b.id);
      const byId = await page.$$eval('#rows tr:not([hidden])', (trs) => trs.map((t) => t.dataset.id));
      ok(byId.includes(b.id) && !byId.includes(a.id) && byId.length < await page.$$eval('#rows tr', (t) => t.length),
        `searching an id's start narrows the list (${byId.length} rows)`);
      await page.fill('#search', '');
      await page.waitForFunction(() => document.querySelectorAll('#rows tr[hidden]').length === 0);
    });

    await step('a name with escape sequences shows them written out, hiding nothing', async () => {
      const w = await launch({ name: 'x\u001b]0;pwned\u0007\u001b[2Jfake\nstatus: ok', code: 'print(1)' });
      await page.waitForSelector(rowSel(w.id), { state: 'attached' });
      const shown = await page.$eval(`${rowSel(w.id)} .wname`, (e) => e.textContent);
      ok(shown === 'x\\x1b]0;pwned\\x07\\x1b[2Jfake\\nstatus: ok',
        `the row shows the name's control characters written out (${JSON.stringify(shown)})`);
    });

    await step('each user\'s page shows their own workers; an administrator may switch to everyone\'s', async () => {
      const made = await api('POST', '/api/v1/users', { name: 'webuser' });
      const launched = await fetch(`${baseUrl}/api/v1/workers`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${made.token}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ n: 1, cpu: 0.1, memory: 0.25, name: 'a-users-own' }),
      }).then((r) => r.json());
      const mine = launched.workers[0].id;
      const theirs = await launch({ name: 'the-administrators-own' });
      await page.waitForSelector(rowSel(theirs.id), { state: 'attached' });
      await page.waitForSelector(rowSel(mine), { state: 'attached' });
      const who = await page.$eval('#whoami', (e) => e.textContent);
      ok(who === 'signed in as admin (administrator)', `the page says who is signed in (${who})`);
      ok(await page.$eval(rowSel(mine), (tr) => tr.hidden), 'the administrator\'s list leaves another user\'s worker out');
      await page.check('#everyone');
      await page.waitForFunction((id) => !document.querySelector(`#rows tr[data-id="${id}"]`).hidden, mine);
      ok(true, 'switched to everyone\'s, it shows');
      await page.uncheck('#everyone');
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/?token=${made.token}`);
      await page.waitForSelector(rowSel(mine), { state: 'attached' });
      const whoUser = await page.$eval('#whoami', (e) => e.textContent);
      ok(whoUser === 'signed in as webuser', `signed in as the user, the page says so (${whoUser})`);
      const ids = await page.$$eval('#rows tr', (trs) => trs.map((t) => t.dataset.id));
      ok(ids.length === 1 && ids[0] === mine, `the user's page holds their worker alone (${ids.join(', ')})`);
      ok(await page.$eval('#everyone-label', (e) => e.hidden), 'a user who is no administrator has no switch');
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/?token=${token}`);
      await page.waitForSelector(rowSel(theirs.id), { state: 'attached' });
      await api('DELETE', `/api/v1/workers/${mine}`);
    });

    await step('a waiting worker\'s row says what it waits for', async () => {
      const hold = await launch({ name: 'hold-a-core', cpu: 1 });
      await rowStatus(page, hold.id, 'running');
      const big = await launch({ name: 'waits-for-room', cpu: 4 });
      try {
        await until(async () => (await getWorker(big.id)).waiting_for, `${big.id} to say what it waits for`);
        const why = (await getWorker(big.id)).waiting_for;
        await page.waitForFunction(({ sel, why }) => (document.querySelector(sel)?.textContent || '').includes(why),
          { sel: `${rowSel(big.id)} .c-status`, why });
        ok(true, `the waiting worker's row says "waiting for ${why}"`);
      } finally {
        // The cores go back whatever happened: later steps need them.
        await api('DELETE', `/api/v1/workers/${big.id}`);
        await api('DELETE', `/api/v1/workers/${hold.id}`);
      }
      await rowStatus(page, big.id, 'stopped');
    });

    await step('a worker stopped at the end of a successful run shows as completed', async () => {
      await api('PUT', '/api/v1/sessions/web-run/lease', { ttl_seconds: 3600, holder: 'web-holder' });
      const runOk = await api('POST', '/api/v1/runs', { mode: 'exec', command: ['true'], holder: 'web-holder', session: 'web-run' });
      const runBad = await api('POST', '/api/v1/runs', { mode: 'exec', command: ['false'], holder: 'web-holder', session: 'web-run' });
      const good = await launch({ name: 'run-ok-0', session: 'web-run', run: runOk.id });
      const bad = await launch({ name: 'run-bad-0', session: 'web-run', run: runBad.id });
      await rowStatus(page, good.id, 'running');
      await rowStatus(page, bad.id, 'running');
      // As muster run ends: the workers are stopped, then the run's end recorded.
      await api('DELETE', `/api/v1/workers/${good.id}`);
      await api('DELETE', `/api/v1/workers/${bad.id}`);
      await api('POST', `/api/v1/runs/${runOk.id}/end`, { status: 'succeeded' });
      await api('POST', `/api/v1/runs/${runBad.id}/end`, { status: 'failed', failure: 'rank 1 failed' });
      await page.waitForSelector(`${rowSel(good.id)}[data-outcome="completed"]`, { state: 'attached' });
      await page.waitForSelector(`${rowSel(bad.id)}[data-outcome="aborted"]`, { state: 'attached' });
      const gb = (await page.textContent(`${rowSel(good.id)} .badge`)).trim();
      const bb = (await page.textContent(`${rowSel(bad.id)} .badge`)).trim();
      const gn = (await page.textContent(`${rowSel(good.id)} .run-note`)).trim();
      ok(gb === 'completed' && gn.includes(runOk.id) && gn.includes('succeeded'),
        `a worker stopped as its run succeeded reads "${gb}" ("${gn}")`);
      ok(bb === 'stopped', `a worker of a failed run still reads "${bb}" ("${(await page.textContent(`${rowSel(bad.id)} .run-note`)).trim()}")`);
      await api('DELETE', '/api/v1/sessions/web-run/lease?holder=web-holder');
    });

    await step('a worker stopped before its run restarted and succeeded does not read completed', async () => {
      await api('PUT', '/api/v1/sessions/web-rerun/lease', { ttl_seconds: 3600, holder: 'web-holder' });
      const run = await api('POST', '/api/v1/runs', { mode: 'exec', command: ['true'], holder: 'web-holder', session: 'web-rerun', max_restarts: 1 });
      const first = await launch({ name: 'attempt-0', session: 'web-rerun', run: run.id });
      await rowStatus(page, first.id, 'running');
      // As muster run restarts: the attempt's workers stopped, the restart recorded, new workers.
      await api('DELETE', `/api/v1/workers/${first.id}`);
      await api('POST', `/api/v1/runs/${run.id}/restarts`, { cause: 'worker 0 failed' });
      const second = await launch({ name: 'attempt-1', session: 'web-rerun', run: run.id });
      await rowStatus(page, second.id, 'running');
      await api('DELETE', `/api/v1/workers/${second.id}`);
      await api('POST', `/api/v1/runs/${run.id}/end`, { status: 'succeeded' });
      await page.waitForSelector(`${rowSel(second.id)}[data-outcome="completed"]`, { state: 'attached' });
      const o = await page.getAttribute(rowSel(first.id), 'data-outcome');
      const b = (await page.textContent(`${rowSel(first.id)} .badge`)).trim();
      const n = (await page.textContent(`${rowSel(first.id)} .run-note`)).trim();
      ok(o === 'aborted' && b === 'stopped' && n.includes('restart 1'),
        `a worker of a replaced attempt reads "${b}" ("${n}"), the last attempt's "completed"`);
      await api('DELETE', '/api/v1/sessions/web-rerun/lease?holder=web-holder');
    });

    // A run's page: its chart is the run's points, and gains points while
    // a worker of the run posts them (with the run's own token, as
    // muster-train does).
    await step('the runs view lists a run; its page\'s chart gains points while it trains', async () => {
      await api('PUT', '/api/v1/sessions/web-train/lease', { ttl_seconds: 3600, holder: 'web-holder' });
      const run = await api('POST', '/api/v1/runs', { mode: 'exec', command: ['train'], holder: 'web-holder', session: 'web-train' });
      const post = 'curl -sS -f -H "Authorization: Bearer $MUSTER_RUN_TOKEN" '
        + '-d "{\\"step\\": $i, \\"values\\": {\\"loss\\": $((1000 - i)), \\"accuracy\\": $i}}" '
        + '"$MUSTER_CONTROLLER_URL/api/v1/runs/$MUSTER_RUN_ID/metrics" > /dev/null';
      const w = await launch({
        name: 'trainer-0', session: 'web-train', run: run.id, kernel: 'sh',
        code: `i=0; while [ $i -lt 300 ]; do ${post}; i=$((i + 1)); sleep 0.25; done`,
      });
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/#/runs`);
      await page.waitForSelector(`#runs-rows tr[data-id="${run.id}"]`, { state: 'attached', timeout: T });
      ok((await page.textContent(`#runs-rows tr[data-id="${run.id}"] .c-status`)).trim() === 'running',
        'the runs table shows the run running');
      await until(async () => (await page.textContent(`#runs-rows tr[data-id="${run.id}"] .c-latest`)).includes('loss'),
        'the runs table shows the run\'s latest loss');
      await page.click(`#runs-rows tr[data-id="${run.id}"]`);
      await until(async () => (await page.evaluate(() => location.hash)) === `#/runs/${run.id}`, 'the run\'s page');
      const count = () => page.evaluate(() => window.musterCharts.get('loss')?.data[0].length || 0);
      const n1 = await until(async () => { const n = await count(); return n >= 2 && n; }, 'the loss chart\'s first points');
      const n2 = await until(async () => { const n = await count(); return n >= n1 + 4 && n; }, 'the loss chart gaining points');
      ok(n2 >= n1 + 4, `the loss chart went from ${n1} to ${n2} points while the worker posted`);
      // Its data are the run's points: the last loss drawn is the last stored.
      // (once the worker has ended: a point it posted just before could
      // otherwise land after the read)
      await api('DELETE', `/api/v1/workers/${w.id}`);
      const ended = await api('POST', '/api/v1/workers/await', { ids: [w.id], wait_for_completion: true, timeout_seconds: 60 });
      // (a stopped worker is among the await's failures: it did not succeed)
      const endedAs = [...ended.workers, ...ended.failures].map((x) => x.status);
      ok(!ended.timed_out && endedAs.length === 1 && ['stopped', 'failed', 'succeeded'].includes(endedAs[0]),
        `the stopped worker ended (${endedAs.join(', ')}${ended.timed_out ? '; the await timed out' : ''})`);
      const stored = await api('GET', `/api/v1/runs/${run.id}/metrics?names=loss`);
      const lastStored = stored.points[stored.points.length - 1].values.loss;
      const lastDrawn = await until(async () => {
        const v = await page.evaluate(() => { const u = window.musterCharts.get('loss'); return u.data[1][u.data[1].length - 1]; });
        return v === lastStored && String(v);
      }, `the chart's last loss to be the last stored (${lastStored})`);
      ok(Number(lastDrawn) === lastStored, `the chart's last loss ${lastDrawn} is the run's last ${lastStored}`);
      ok(await page.isVisible('#run-charts figure[data-name="accuracy"]'), 'the accuracy chart is there too');
      await page.screenshot({ path: path.join(shotDir, 'web-ui-run.png') });
      await api('DELETE', '/api/v1/sessions/web-train/lease?holder=web-holder');
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/#/`);
    });

    // Many ranks: a run of 10 ranks is drawn as their mean between their
    // least and greatest, not 10 lines.
    await step('a run of 10 ranks is drawn as their mean with a min-max band', async () => {
      await api('PUT', '/api/v1/sessions/web-band/lease', { ttl_seconds: 3600, holder: 'web-holder' });
      const run = await api('POST', '/api/v1/runs', { mode: 'exec', command: ['train'], holder: 'web-holder', session: 'web-band' });
      const now = Date.now() / 1000;
      const points = [];
      for (let rank = 0; rank < 10; rank++) {
        for (let step = 0; step < 30; step++) points.push({ step, rank, at: now - 30 + step, values: { loss: 10 - step / 10 + rank } });
      }
      await api('POST', `/api/v1/runs/${run.id}/metrics`, points);
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/#/runs/${run.id}`);
      const shape = await until(async () => page.evaluate(() => {
        const u = window.musterCharts.get('loss');
        if (!u) return null;
        return { labels: u.series.map((x) => x.label), cols: u.data.length, n: u.data[0].length, d: u.data.map((c) => Array.from(c)) };
      }), 'the loss chart');
      ok(shape.cols === 4 && shape.labels.slice(1).join(',') === 'mean,least,greatest',
        `the chart has the mean, least and greatest of the 10 ranks (${shape.labels.join(',')})`);
      let inside = shape.n > 0;
      for (let i = 0; i < shape.n; i++) {
        const [mean, lo, hi] = [shape.d[1][i], shape.d[2][i], shape.d[3][i]];
        if (mean === null) continue;
        if (!(lo <= mean && mean <= hi && hi - lo >= 8.9)) inside = false;
      }
      ok(inside, `every bin's mean lies between the ranks' least and greatest, 9 apart (${shape.n} bins)`);
      ok((await page.textContent('#run-charts figure[data-name="loss"] figcaption')).includes('mean of 10 ranks'),
        'the chart says it draws the mean of 10 ranks');
      await api('DELETE', '/api/v1/sessions/web-band/lease?holder=web-holder');
      await page.goto('about:blank');
      await page.goto(`${baseUrl}/#/`);
    });

    // Narrow screens: readable at 400 px.
    await step('readable at 400 px', async () => {
      await page.setViewportSize({ width: 400, height: 800 });
      const wide = await page.evaluate(() => document.documentElement.scrollWidth);
      ok(wide <= 400, `no horizontal scrolling at 400 px (page is ${wide} px wide)`);
      ok(await page.isHidden('#table th.c-ip'), 'less important columns are hidden at 400 px');
      await page.screenshot({ path: path.join(shotDir, 'web-ui-400.png') });
      await page.setViewportSize({ width: 1280, height: 800 });
    });

    // 6. A dozen workers in mixed states, for the screenshot.
    await step('screenshot with workers in mixed states', async () => {
      const ids = [];
      const add = async (spec) => {
        const ws = [].concat(await launch(spec));
        ids.push(...ws.map((w) => w.id));
        return ws[0];
      };
      await add({ name: 'ps-0', session: 'mnist-ps', role: 'ps', cpu: 1, memory: 2 });
      await add({ name: 'worker-0', session: 'mnist-ps', role: 'worker', cpu: 1, memory: 2, code: 'import time; time.sleep(60)' });
      await add({ name: 'worker-1', session: 'mnist-ps', role: 'worker', cpu: 1, memory: 2, code: 'import time; time.sleep(60)' });
      await add({ name: 'eval', session: 'notebook', cpu: 0.5, memory: 1, code: 'print("accuracy 0.981")' });
      const preprocess = await add({ name: 'preprocess', session: 'notebook', cpu: 0.5, memory: 1, code: 'raise SystemExit("no such file: shards/07.parquet")' });
      await add({ name: 'big-a', session: 'sweep', cpu: 2, memory: 4, code: 'print("lr=0.1")' });
      await add({ name: 'big-b', session: 'sweep', cpu: 2, memory: 4, code: 'print("lr=0.01")' });
      for (const id of ids) await page.waitForSelector(rowSel(id), { state: 'attached' });
      await until(async () => {
        const st = await page.$$eval('#rows tr', (trs) => trs.map((t) => t.dataset.status));
        return ['running', 'succeeded', 'failed', 'stopped', 'scheduling'].every((s) => st.includes(s));
      }, 'running, succeeded, failed, stopped and scheduling rows');
      const n = await page.$$eval('#rows tr', (trs) => trs.length);
      ok(n >= 12, `the table holds ${n} workers in mixed states`);
      await page.evaluate(() => document.activeElement && document.activeElement.blur());
      await page.waitForFunction(() => !document.activeElement || document.activeElement === document.body);
      const out = process.env.MUSTER_WEB_SCREENSHOT === '1'
        ? path.join(repo, 'docs', 'web-ui.png')
        : path.join(shotDir, 'web-ui.png');
      await page.screenshot({ path: out });
      ok(fs.statSync(out).size > 10000, `screenshot written to ${out}`);
      // The session filter narrows the table.
      await page.selectOption('#filter-session', 'sweep');
      const visible = await page.$$eval('#rows tr:not([hidden])', (trs) => trs.length);
      ok(visible === 2, `the session filter shows only that session (${visible} rows)`);
      await page.selectOption('#filter-session', '');
      // The failed workers: step 2's exiter and preprocess, which fails
      // on its own time. Both failed for the controller, then as rows.
      await until(async () => (await getWorker(preprocess.id)).status === 'failed',
        `preprocess (${preprocess.id}) to fail in the API`);
      const failedIds = (await api('GET', '/api/v1/workers?status=failed&limit=5000')).workers.map((w) => w.id);
      await until(async () => {
        const shown = await page.$$eval('#rows tr[data-status="failed"]', (trs) => trs.map((t) => t.dataset.id));
        return failedIds.every((id) => shown.includes(id));
      }, `the rows of the ${failedIds.length} failed workers (${failedIds.join(', ')}) to show failed`);
      await page.selectOption('#filter-status', 'failed');
      const fv = await page.$$eval('#rows tr:not([hidden])', (trs) => trs.map((t) => t.dataset.status));
      ok(fv.length >= 2 && fv.length === failedIds.length && fv.every((s) => s === 'failed'),
        `the status filter shows only failed workers (${fv.length}; the API has ${failedIds.length})`);
      await page.selectOption('#filter-status', '');
    });

    await step('older workers load a page at a time', async () => {
      // 205 more short-lived workers: more than the table's first page (200).
      const paging = await api('POST', '/api/v1/workers', { n: 205, cpu: 0.01, memory: 0.01, kernel: 'sh', code: 'true', session: 'paging' });
      // All ended before the page loads: a worker still changing state
      // would reach the table through the event stream, beyond its first
      // page (at 0.01 core, a worker's start takes a while).
      const done = await api('POST', '/api/v1/workers/await', {
        ids: paging.workers.map((w) => w.id), wait_for_completion: true, timeout_seconds: 180,
      });
      ok(!done.timed_out, `the 205 paging workers ended (${done.workers.length} succeeded)`);
      const total = (await api('GET', '/api/v1/workers?limit=5000')).workers.length;
      await page.goto(`${baseUrl}/`);
      await page.waitForSelector('#rows tr', { state: 'attached' });
      await until(async () => (await page.$$eval('#rows tr', (trs) => trs.length)) === 200, 'the first page of 200 rows');
      ok(await page.isVisible('#more'), 'a "Load older workers" button is shown');
      await page.click('#more');
      await until(async () => (await page.$$eval('#rows tr', (trs) => trs.length)) === total, `all ${total} rows`);
      ok(!(await page.isVisible('#more')), 'the button goes once every worker is loaded');
    });

    ok(pageErrors.length === 0, 'no errors in the page', pageErrors.join('\n'));
  } finally {
    await cleanup(context);
  }
}

async function cleanup(context) {
  try {
    if (ctl && ctl.exitCode === null) {
      const list = await api('GET', '/api/v1/workers');
      for (const w of list.workers) {
              if (['scheduling', 'starting', 'running'].includes(w.status)) {
          await api('DELETE', `/api/v1/workers/${w.id}`).catch(() => {});
        }
      }
    }
  } catch (e) {
    console.log(`# cleanup: ${e.message}`);
  }
  await stopController().catch(() => {});
  // The pid each workerd registered with, from the controller's database
  // (backend_ref is the backend's business, not a pid).
  try {
    const out = execFileSync('sqlite3', ['-readonly', path.join(stateDir, 'muster.db'),
      'SELECT pid FROM workers WHERE pid IS NOT NULL'], { encoding: 'utf8' });
    for (const line of out.split('\n')) if (line.trim()) allWorkerPids.add(Number(line));
  } catch (e) {
    console.log(`# cleanup: ${e.message}`);
  }
  for (const pid of allWorkerPids) {
    if (pid > 1) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch (_) { /* already gone */ }
    }
  }
  if (context) await Promise.race([context.close().catch(() => {}), sleep(T)]);
  // The cgroups its workers leave (they outlive a controller by design).
  try {
    execFileSync('bash', [path.join(here, '..', 'cgroup_clean.sh'), tmp], { stdio: 'inherit' });
  } catch (e) {
    console.log(`# cleanup: ${e.message}`);
  }
  // A sanitizer report from the controller or a workerd (ASan builds) fails the test.
  const logs = [path.join(tmp, 'controller.log')];
  const wdir = path.join(stateDir, 'workers');
  if (fs.existsSync(wdir)) for (const f of fs.readdirSync(wdir)) logs.push(path.join(wdir, f));
  const reports = logs.filter((f) => {
    try {
      return /AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:/.test(fs.readFileSync(f, 'utf8'));
    } catch (_) {
      return false;
    }
  });
  ok(reports.length === 0, 'no sanitizer report in the daemons\' logs', reports.join('\n'));
}

// Leave nothing running when cut short (watchdog, Ctrl-C, a closed pipe).
function killAllNow() {
  try {
    if (ctl && ctl.exitCode === null) ctl.kill('SIGKILL');
  } catch (_) { /* gone */ }
  for (const pid of allWorkerPids) {
    try {
      if (pid > 1) process.kill(-pid, 'SIGKILL');
    } catch (_) { /* gone */ }
  }
}
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    killAllNow();
    process.exit(1);
  });
}
process.stdout.on('error', () => {}); // e.g. piped into head
const watchdog = setTimeout(() => {
  console.log('not ok - the whole test took over 5 minutes');
  killAllNow();
  process.exit(1);
}, 300000);
watchdog.unref();

try {
  await main();
} catch (e) {
  ok(false, 'the test ran to its end', e && e.stack);
}
console.log(`${passed} passed, ${failed} failed`);
if (failed || process.env.MUSTER_WEB_KEEP === '1') console.log(`# controller log and screenshots kept in ${tmp}`);
else fs.rmSync(tmp, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
