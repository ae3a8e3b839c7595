"""ctl_proc: a muster-controller that a bench starts and stops (bench/controller,
bench/metrics): on a free loopback port, in a state directory of its own,
ended by pid, with whatever workerd it left killed by pid and start time."""
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time

import local_workers  # bench/local_workers.py

CLK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Controller:
    """A muster-controller of this bench, on a free port, in its own state dir."""

    def __init__(self, build, state, *args, tls=None, port=None, ready_timeout=20):
        self.port = port or free_port()
        self.state = state
        self.tls = tls  # the directory of make_ca.sh's files, or None
        self.log = open(os.path.join(state + ".log"), "ab")
        env = dict(os.environ, MUSTER_ORPHAN_TIMEOUT="120")
        if tls:
            env["MUSTER_CA_FILE"] = os.path.join(tls, "ca.pem")
            args = args + ("--tls-cert", os.path.join(tls, "cert.pem"),
                           "--tls-key", os.path.join(tls, "key.pem"))
        # (a local backend's workers on the host's network: this bench
        # measures the controller, and never takes the default bridge,
        # which another controller, scripts/run.sh's, may hold)
        if "--backend" not in args and "--network" not in args:
            args = args + ("--network", "host")
        self.proc = subprocess.Popen(
            [os.path.join(build, "muster-controller"), "--listen", "127.0.0.1:%d" % self.port,
             "--state-dir", state, *args], stdout=self.log, stderr=self.log, env=env)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                c = self.connect(2)
                c.request("GET", "/api/v1/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise SystemExit("bench: the controller did not answer in %d s; see "
                             "%s.log" % (ready_timeout, state))
        if self.proc.poll() is not None:
            self.stop()
            raise SystemExit("bench: the controller exited (%d); see %s.log"
                             % (self.proc.returncode, state))
        with open(os.path.join(state, "token")) as f:
            self.token = f.read().strip()
        self.conn = self.connect(300)

    def connect(self, timeout):
        """A new connection to the controller: HTTPS verified with the CA,
        or plain HTTP."""
        if not self.tls:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        ctx = ssl.create_default_context(cafile=os.path.join(self.tls, "ca.pem"))
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)

    def call(self, method, path, body=None):
        self.conn.request(method, path, json.dumps(body) if body is not None else None,
                          {"Authorization": "Bearer " + self.token,
                           "Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError("%s %s: %d %r" % (method, path, r.status, data[:300]))
        return json.loads(data) if data else None

    def cpu_s(self):
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK

    def rss_bytes(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def children(self):
        """The pids of the controller's child processes (its workerds, which
        it adopts as a child subreaper, and its fork server)."""
        pids = []
        read = 0
        for tid in os.listdir("/proc/%d/task" % self.proc.pid):
            try:
                with open("/proc/%d/task/%s/children" % (self.proc.pid, tid)) as f:
                    pids += [int(p) for p in f.read().split()]
                read += 1
            except FileNotFoundError:
                pass  # (a thread that has ended)
        if not read:
            raise RuntimeError("cannot read the controller's children from /proc (a kernel"
                               " without CONFIG_PROC_CHILDREN?)")
        return set(pids)

    def kill9(self):
        """Kills the controller at once (a crash), leaving its workers."""
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def stop(self):
        """Ends the controller, then kills whatever workerd it started and
        left running (by pid and start time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        local_workers.kill_all(self.state)
