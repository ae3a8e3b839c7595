"""scale: part (g) of bench/controller: 100,000 simulated live workers on one
controller (the external backend starts nothing; bench/loadgen.c plays their
workerds: registers each, then heartbeats at the interval the answers
tell, on hosts of z["scale_per_host"] workers that beat as one, as workerds
do once the interval is stretched (--host-beat auto: one call a host an
interval, its agent's, carrying the others'; each call on a connection of
its own while that interval is longer than 10 s, as a workerd's then is).

Prints, beside the same controller's cost had every worker beaten every
2 s (today's rule before --heartbeat-rate: its CPU per heartbeat on kept
connections, as at 2 s, measured in this run, times 0.5 heartbeats per
worker per second):
- controller CPU per live worker per second, and so the cores for all;
  then the same heartbeats each worker's own (as before host beats), on a
  connection of its own each, and on kept connections;
- memory and database bytes per worker;
- p99 of GET /api/v1/workers/{id} and of an await's wake (from the stop
  that ends the worker to the await's answer, timed by bench/loadgen.c)
  while they beat;
- the time a controller killed with SIGKILL and started again takes to
  hear from every worker again (each running worker's stored heartbeat
  newer than the restart), and GET /api/v1/workers/{id} meanwhile.
"""
import http.client
import json
import os
import signal
import sqlite3
import time

from ctl_proc import Controller


def _metric(ctl, name):
    c = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=60)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError("/metrics has no %s" % name)


def _running(ctl):
    return _metric(ctl, 'muster_workers{status="running"}')


def _wait(what, cond, timeout):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise RuntimeError("(g): %s did not happen within %d s" % (what, timeout))
        time.sleep(0.2)


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int(t % 1 * 1000)


def _heard_since(state, since_iso):
    """How many running workers' stored heartbeats are newer than since."""
    db = sqlite3.connect("file:%s/muster.db?mode=ro" % state, uri=True, timeout=30)
    try:
        return db.execute("SELECT count(*) FROM workers WHERE status = 'running' AND "
                          "last_heartbeat >= ?", (since_iso,)).fetchone()[0]
    finally:
        db.close()


def _cpu_window(ctl, gen, sig, window):
    """Sends the load generator sig (a change of how its workers beat),
    lets 2 s pass, and returns the controller's CPU seconds over the next
    window and that window's length."""
    gen.send_signal(sig)
    time.sleep(2)
    cpu0, t0 = ctl.cpu_s(), time.time()
    time.sleep(window)
    return ctl.cpu_s() - cpu0, time.time() - t0


def bench_scale(build, tmp, secs, z, loadgen, loadgen_bg, end):
    state = os.path.join(tmp, "g")
    n = z["scale_n"]
    args = ("--backend", "external", "--start-timeout", "3600")
    ctl = Controller(build, state, *args)
    gen = get = None
    try:
        rss0 = ctl.rss_bytes()
        ids = []
        while len(ids) < n:
            ids += [w["id"] for w in ctl.call("POST", "/api/v1/workers",
                                              {"n": min(1000, n - len(ids)), "cpu": 1,
                                               "memory": 1, "session": "scale"})["workers"]]
        _wait("every worker starting",
              lambda: _metric(ctl, 'muster_workers{status="starting"}') == n, 120)
        n -= z["scale_wakes"]  # (stopped by the first wakes)
        # An await's wake with no heartbeats coming in (the reference for
        # the one measured while they come), on workers that then leave.
        wfile_wakes = os.path.join(tmp, "g.wakes0")
        quiet_ids, ids = ids[:z["scale_wakes"]], ids[z["scale_wakes"]:]
        with open(wfile_wakes, "w") as f:
            f.write("\n".join(quiet_ids) + "\n")
        quiet = loadgen(build, "wakes", ctl.port, ctl.token, wfile_wakes)
        db = sqlite3.connect("file:%s/muster.db?mode=ro" % state, uri=True)
        rows = db.execute("SELECT id, token, attempt FROM workers WHERE status = 'starting'"
                          ).fetchall()
        db.close()
        wfile = os.path.join(tmp, "g.workers")
        with open(wfile, "w") as f:
            for row in rows:
                f.write("%s %s %d\n" % row)
        t_reg = time.time()
        gen = loadgen_bg(build, "workers", ctl.port, wfile, 2.0, 3600, 16,
                         "hosts=%d" % z["scale_per_host"])
        _wait("every worker registered", lambda: _running(ctl) == n, 600)
        reg_s = time.time() - t_reg
        interval = _metric(ctl, "muster_heartbeat_interval_seconds")
        # One interval for the beats to spread, then the CPU over at least
        # one more, counted in heartbeats by the stored heartbeat times.
        time.sleep(min(interval, z["scale_settle"]))
        window = max(secs, z["scale_window"])
        cpu0, t0 = ctl.cpu_s(), time.time()
        time.sleep(window)
        cpu1, t1 = ctl.cpu_s(), time.time()
        rss1 = ctl.rss_bytes()
        beats = n * (t1 - t0) / interval  # each worker beats once an interval
        steady = loadgen(build, "get", ctl.port, "/api/v1/workers/" + ids[n // 2], 1, secs,
                         ctl.token)
        wfile_wakes = os.path.join(tmp, "g.wakes")
        with open(wfile_wakes, "w") as f:
            f.write("\n".join(ids[:z["scale_wakes"]]) + "\n")
        wakes = loadgen(build, "wakes", ctl.port, ctl.token, wfile_wakes)
        live = int(_running(ctl))
        # The same heartbeats, each worker's own, on a connection of its
        # own each (what workerds sent before they beat per host) ...
        own_cpu, own_s = _cpu_window(ctl, gen, signal.SIGUSR2, window)
        own_beats = live * own_s / interval
        # ... and on connections kept open (what they cost while the
        # interval is 10 s or less, as at 2 s): the reference for the fixed
        # interval of before.
        kept_cpu, kept_s = _cpu_window(ctl, gen, signal.SIGUSR1, window)
        kept_beats = live * kept_s / interval
        # (per host again, as workerds are, for the restart)
        gen.send_signal(signal.SIGUSR1)
        gen.send_signal(signal.SIGUSR2)
        # A crash and a restart: the workers' heartbeats fail meanwhile and
        # are tried again at each worker's next turn.
        t_kill = time.time()
        ctl.kill9()
        ctl = Controller(build, state, *args, port=ctl.port, ready_timeout=120)
        t_up = time.time()
        get = loadgen_bg(build, "get", ctl.port, "/api/v1/workers/" + ids[n // 2], 1,
                         z["scale_get_during"], ctl.token)
        since = _iso(t_kill)
        heard = 0
        while time.time() - t_kill < z["scale_reattach_max"]:
            heard = _heard_since(state, since)
            if heard >= live:
                break
            time.sleep(0.25)
        reattach_s = time.time() - t_kill
        failed = _metric(ctl, 'muster_workers{status="failed"}')
        during = json.loads(get.communicate()[0].strip().splitlines()[-1])
    finally:
        end(gen)
        end(get)
        ctl.stop()
    dbbytes = sum(os.path.getsize(os.path.join(state, f)) for f in os.listdir(state)
                  if f.startswith("muster.db"))
    cpu = (cpu1 - cpu0) / (t1 - t0)
    per_hb_us = (cpu1 - cpu0) / beats * 1e6
    own = own_cpu / own_s
    own_hb_us = own_cpu / own_beats * 1e6
    kept = kept_cpu / kept_s
    kept_hb_us = kept_cpu / kept_beats * 1e6
    old_cores = kept_hb_us * 1e-6 * n / 2.0
    print("(g) %s simulated live workers (registered in %.0f s), told to beat every %.1f s"
          " (--heartbeat-rate 5000):" % (format(n, ","), reg_s, interval))
    print("    controller CPU %.3f cores: %.2f us per live worker per second, %.1f us per heartbeat"
          " (target: 100,000 <= 0.25 core, so <= 2.50 us), %s"
          % (cpu, cpu / n * 1e6, per_hb_us,
             "beating per host, %d workers a host: one call a host, %s"
             % (z["scale_per_host"], "on a connection of its own, as a workerd told an interval "
                "past 10 s sends it" if interval > 10 else "on kept connections")))
    print("    the same heartbeats each worker's own, each on a connection of its own: %.3f"
          " cores, %.1f us per heartbeat (ratio %.2f)" % (own, own_hb_us, cpu / own if own else
                                                          float("nan")))
    print("    the same heartbeats each worker's own on kept connections: %.3f cores, %.1f us"
          " per heartbeat" % (kept, kept_hb_us))
    print("    every 2 s as before (kept connections): %.1f us per heartbeat (this run) x 0.5 ="
          " %.1f us per worker per second, %.2f cores for %s (ratio %.2f)"
          % (kept_hb_us, kept_hb_us / 2, old_cores, format(n, ","),
             cpu / old_cores if old_cores else float("nan")))
    print("    memory %.0f bytes/worker (RSS %.1f -> %.1f MiB; target <= 1024), database %.0f"
          " bytes/worker" % ((rss1 - rss0) / n, rss0 / 2**20, rss1 / 2**20, dbbytes / n))
    print("    GET /workers/{id} meanwhile: p50 %.2f ms, p99 %.2f ms (target p99 <= 10 ms);"
          " await wake p50 %.2f ms, p99 %.2f ms of %d (target p99 <= 2 ms)"
          % (steady["p50_ms"], steady["p99_ms"], wakes["p50_ms"], wakes["p99_ms"],
             wakes["requests"]))
    print("    await wake among as many live workers with no heartbeats coming in: p50 %.2f ms,"
          " p99 %.2f ms of %d (ratio of the p99s %.1f)"
          % (quiet["p50_ms"], quiet["p99_ms"], quiet["requests"],
             wakes["p99_ms"] / quiet["p99_ms"] if quiet["p99_ms"] else float("nan")))
    print("    kill -9 and restart: answering after %.1f s, every one of %s running workers heard"
          " from again after %.1f s (%s; target <= 30 s), %d failed"
          % (t_up - t_kill, format(live, ","), reattach_s,
             "all" if heard >= live else "only %d" % heard, failed))
    print("    GET /workers/{id} in the restart's first %.0f s: %d answered, %d errors, p50 %.2f ms,"
          " p99 %.2f ms, max %.2f ms" % (z["scale_get_during"], during["requests"],
                                         during["errors"], during["p50_ms"], during["p99_ms"],
                                         during["max_ms"]))
