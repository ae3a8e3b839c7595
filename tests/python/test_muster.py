"""Tests of sdk/python/muster.py against a real muster controller.

The module starts build/muster-controller itself (the build directory comes
from MUSTER_BUILD_DIR, default /work/main/build) on a free 127.0.0.1 port with
a fresh state directory and --cpus 8, and at the end stops every worker it
launched, SIGTERMs the controller and kills, by process group, any workerd it
started that is still alive.

    MUSTER_BUILD_DIR=build python3 -m unittest -v tests/python/test_muster.py
"""

import datetime
import http.server
import inspect
import json
import os
import shutil
import signal
import sqlite3
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "sdk", "python"))

import muster  # noqa: E402
import muster as cdsw  # noqa: E402  (the CML spelling)

BUILD_DIR = os.environ.get("MUSTER_BUILD_DIR", "/work/main/build")
CONTROLLER_BIN = os.path.join(BUILD_DIR, "muster-controller")

# The controller of this module, and every worker the tests launched.
CTL = {"proc": None, "state_dir": None, "url": None, "token": None, "log": None}
LAUNCHED = {}  # id -> last worker dict seen (for backend_ref)


def _note(workers):
    for w in workers:
        if isinstance(w, dict) and w.get("id"):
            old = LAUNCHED.get(w["id"]) or {}
            if w.get("backend_ref") or not old.get("backend_ref"):
                LAUNCHED[w["id"]] = w
    return workers


def _controller_log():
    try:
        with open(CTL["log"], "r", errors="replace") as f:
            return f.read()[-4000:]
    except (OSError, TypeError):
        return "(no controller log)"


def setUpModule():
    if not os.access(CONTROLLER_BIN, os.X_OK):
        raise RuntimeError(
            "%s is not an executable: build muster first, or point MUSTER_BUILD_DIR "
            "at the build directory" % CONTROLLER_BIN)
    state_dir = tempfile.mkdtemp(prefix="muster-pytest-")
    CTL["state_dir"] = state_dir
    # Workers start in a directory of their own: their code runs as another
    # account (muster-worker), which may not enter the state directory.
    CTL["workdir"] = tempfile.mkdtemp(prefix="muster-pytest-wd-")
    os.chmod(CTL["workdir"], 0o755)
    CTL["log"] = os.path.join(state_dir, "controller.log")
    with open(CTL["log"], "wb") as log:
        # Port 0: the controller binds a free port itself (no race) and
        # writes the address it got to STATE_DIR/url.
        CTL["proc"] = subprocess.Popen(
            [CONTROLLER_BIN, "--listen", "127.0.0.1:0", "--network", "host", "--state-dir", state_dir,
             "--cpus", "8", "--workdir", CTL["workdir"]],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url_file = os.path.join(state_dir, "url")
    token_file = os.path.join(state_dir, "token")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if CTL["proc"].poll() is not None:
            raise RuntimeError("muster-controller exited with %s:\n%s"
                               % (CTL["proc"].returncode, _controller_log()))
        if os.path.exists(url_file) and os.path.exists(token_file):
            try:
                with open(url_file) as uf, open(token_file) as tf:
                    c = muster.Client(url=uf.read().strip(), token=tf.read().strip())
                if c.health().get("status") == "ok":
                    CTL["url"], CTL["token"] = c.url, c.token
                    return
            except muster.MusterError:
                pass
        time.sleep(0.05)  # the controller is starting: nothing to await yet
    tearDownModule()
    raise RuntimeError("muster-controller did not come up in 15 s:\n" + _controller_log())


def _children_of(pid):
    """Pids whose parent is pid (the controller's workerds and fork server)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "r") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(name))
    return out


def _is_our_workerd_group(pid):
    """True if pid is (or was) a workerd this test's controller started.

    A pid that no longer exists is still safe to signal as a process group:
    Linux never hands out a pid that is in use as a process group id, so the
    group is either ours or empty."""
    try:
        with open("/proc/%d/stat" % pid, "r") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return True
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"muster-workerd" in f.read()
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False


def tearDownModule():
    proc = CTL["proc"]
    pids = set()
    if CTL["url"]:
        c = muster.Client(url=CTL["url"], token=CTL["token"])
        try:
            if LAUNCHED:
                _note(c.stop_workers(*LAUNCHED.keys()))
            _note(c.list_workers(all_sessions=True))
        except muster.MusterError as e:
            sys.stderr.write("teardown: %s\n" % e)
    # The pid each workerd registered with, from the controller's database.
    if CTL["state_dir"]:
        try:
            db = sqlite3.connect("file:%s/muster.db?mode=ro" % CTL["state_dir"], uri=True)
            pids.update(p for (p,) in db.execute("SELECT pid FROM workers WHERE pid > 1"))
            db.close()
        except sqlite3.Error as e:
            sys.stderr.write("teardown: %s\n" % e)
    if proc is not None:
        pids.update(_children_of(proc.pid))
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for pid in sorted(pids):
        if pid > 1 and _is_our_workerd_group(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    if CTL["state_dir"]:
        # the cgroups its workers leave (they outlive a controller by design)
        subprocess.run(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                             "cgroup_clean.sh"), CTL["state_dir"]], check=False)
    if CTL["state_dir"] and not os.environ.get("MUSTER_KEEP_STATE"):
        shutil.rmtree(CTL["state_dir"], ignore_errors=True)
    if CTL.get("workdir"):
        shutil.rmtree(CTL["workdir"], ignore_errors=True)


class MusterTestCase(unittest.TestCase):
    maxDiff = None

    def client(self, session, token=None, lease=False):
        """A client of session; with lease=True it holds the session's lease
        (given back, its workers stopped, at the end of the test)."""
        c = muster.Client(url=CTL["url"], token=token or CTL["token"], session=session,
                          lease=lease)
        if lease:
            self.addCleanup(c.close)
        return c

    def launch(self, c, *args, **kw):
        """c.launch_workers(...), remembered for the cleanup."""
        ws = _note(c.launch_workers(*args, **kw))
        ids = [w["id"] for w in ws]
        self.addCleanup(lambda: self._stop_and_await(c, ids))
        return ws

    def _stop_and_await(self, c, ids):
        """Stops ids and waits for them to end: a worker still in its stop
        grace holds its cores, and the next test's workers would wait."""
        _note(c.stop_workers(*ids))
        try:
            c.await_workers(ids, wait_for_completion=True, timeout_seconds=30)
        except muster.MusterError:
            pass  # ended some other way: what matters is that they did

    def env(self, **values):
        """Replaces the MUSTER_* environment for this test (None unsets)."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        for k, v in values.items():
            if v is not None:
                clean[k] = v
        patcher = mock.patch.dict(os.environ, clean, clear=True)
        patcher.start()
        self.addCleanup(patcher.stop)
        # The module functions' default client is made from the environment;
        # the test's own is closed (its lease given back) at the test's end.
        self.addCleanup(setattr, muster, "_default_client", None)
        self.addCleanup(lambda: muster._default_client and muster._default_client.close())
        muster._default_client = None


class RunCluster(MusterTestCase):
    """run_cluster drives `muster run` (the C command line tool)."""

    def setUp(self):
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"))

    def test_exec_mode_gives_torchrun_variables_and_returns_worker_0s_summary(self):
        c = self.client("rc")
        lines = []
        res = c.run_cluster(2, 0, 0.1, 0.25, mode="exec", output=lines.append, command=[
            "sh", "-c", 'echo "{\\"rank\\": $RANK, \\"world\\": $WORLD_SIZE, '
                        '\\"master\\": \\"$MASTER_ADDR\\"}"'])
        self.assertEqual(res["exit_code"], 0)
        self.assertEqual(res["summary"]["rank"], 0)
        self.assertEqual(res["summary"]["world"], 2)
        self.assertTrue(res["summary"]["master"].startswith("127."))
        self.assertTrue(any(l.startswith("[worker-1] ") and '"rank": 1' in l for l in lines), lines)

    def test_each_ranks_output_is_read_back_after_the_run(self):
        # The printout in the cell was the only copy: Run.logs(rank) reads
        # what every rank wrote from its worker's log.
        c = self.client("rc-logs")
        res = c.run_cluster(2, 0, 0.1, 0.25, mode="exec", output=lambda line: None, command=[
            "sh", "-c", 'echo "out of rank $RANK"; echo "err of rank $RANK" >&2'])
        self.assertIsInstance(res, muster.Run)
        self.assertEqual(res.logs(1), "out of rank 1\n")
        self.assertEqual(res.logs(0, "stderr"), "err of rank 0\n")
        self.assertEqual(len(res.worker_ids()), 2)
        with self.assertRaises(muster.MusterError) as e:
            res.logs(2)
        self.assertEqual(e.exception.field, "rank")

    def test_an_allreduce_ranks_output_is_read_back_by_its_rank(self):
        if not shutil.which("mpirun"):
            self.skipTest("Open MPI's mpirun is not installed")
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"), OMPI_ALLOW_RUN_AS_ROOT="1",
                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        c = self.client("rc-arlogs")
        res = c.run_cluster(2, 0, 0.5, 0.25, mode="allreduce", output=lambda line: None, command=[
            "sh", "-c", 'echo "out of rank $OMPI_COMM_WORLD_RANK"'])
        self.assertEqual((res.logs(0), res.logs(1)), ("out of rank 0\n", "out of rank 1\n"))

    def test_a_failed_runs_error_reads_the_failed_ranks_stderr_back(self):
        c = self.client("rc-faillogs")
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(2, 0, 0.1, 0.25, mode="exec", output=lambda line: None, command=[
                "sh", "-c", 'if [ "$RANK" = 1 ]; then echo "ValueError: bad batch" >&2; exit 3; fi'])
        self.assertIn("ValueError: bad batch", e.exception.run.logs(1, "stderr"))

    def test_a_request_muster_run_refuses_raises_invalid_value_with_its_words(self):
        c = self.client("rc-usage")
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(1, 0, 0.1, 0.25, nvidia_gpu=100, mode="exec", command=["true"],
                          output=lambda line: None)
        self.assertEqual(e.exception.code, "invalid_value")
        self.assertIn("--gpu must be a whole number from 0 to 64", e.exception.message)

    def test_the_sessions_other_workers_are_left_alone(self):
        c = self.client("rc-shared")
        idle = self.launch(c, 1, 0.1, 0.25)
        c.await_workers(idle, wait_for_completion=False, timeout_seconds=20)
        c.run_cluster(1, 0, 0.1, 0.25, mode="exec", command=["true"], output=lambda line: None)
        self.assertEqual(c.get_worker(idle[0]["id"])["status"], "running")

    def test_a_failing_worker_raises_naming_it_without_waiting_for_the_rest(self):
        c = self.client("rc")
        t0 = time.monotonic()
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(2, 0, 0.1, 0.25, mode="exec", output=lambda line: None, command=[
                "sh", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 300'])
        self.assertEqual(e.exception.code, "training_failed")
        self.assertIn("worker 1", e.exception.message)
        self.assertIn("exited with code 3", e.exception.message)
        # Well before rank 0's 300 s, with the starts of its workers and of
        # muster run (a loaded machine takes its time over those).
        self.assertLess(time.monotonic() - t0, 60)

    def test_a_start_timeout_raises_naming_what_the_worker_waited_for(self):
        # It raised "did not start: still not running when the timeout passed".
        c = self.client("rc-waits")
        big = self.launch(c, 1, 8, 0.5)[0]
        c.await_workers(big, wait_for_completion=False, timeout_seconds=30)
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(1, 0, 1, 0.25, mode="exec", command=["true"], timeout_seconds=2,
                          output=lambda line: None)
        self.assertEqual(e.exception.code, "training_failed")
        self.assertRegex(e.exception.message, r"^did not start in 2 s: worker 0 \(w-[a-z0-9]{10}\) "
                                              r"waits for 1 core \(0 free of 8\)$")

    def test_a_cluster_that_can_never_run_at_once_is_refused_with_the_arithmetic(self):
        c = self.client("rc-gang")
        t0 = time.monotonic()
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(3, 0, 4, 0.25, mode="exec", command=["true"], output=lambda line: None)
        self.assertEqual(e.exception.code, "exceeds_capacity")
        self.assertEqual(e.exception.field, "cpu")
        self.assertIn("3 workers × 4 cores = 12 cores, but this host has 8 cores in all",
                      e.exception.message)
        self.assertLess(time.monotonic() - t0, 15)

    def test_a_passed_through_muster_poll_line_is_not_taken_for_muster_runs_error(self):
        # mpirun's untagged lines pass through as they are, and the rsh agent
        # prints "muster: poll: ..." on its way out: run_cluster took the
        # first "muster: <word>: ..." line for muster run's own error and
        # raised MusterError("poll"). A stand-in for muster run prints what an
        # allreduce run whose restart's launch was refused prints.
        fake = os.path.join(CTL["state_dir"], "fake-muster-run")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\n"
                    "echo '[rank-0] step 1'\n"
                    "echo 'muster: poll: Interrupted system call' >&2\n"
                    "echo 'muster run: restart 1: rank 1 (w-aaaaaaaaaa) exited with code 3' >&2\n"
                    "echo 'muster run: ERROR: conflict: run r-aaaaaaaaaa has ended' >&2\n"
                    "exit 4\n")
        os.chmod(fake, 0o755)
        self.env(MUSTER_CLI=fake)
        c = self.client("rc-poll")
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(2, 0, 0.5, 0.25, mode="allreduce", command=["true"],
                          output=lambda line: None)
        self.assertEqual(e.exception.code, "conflict")
        self.assertEqual(e.exception.message, "run r-aaaaaaaaaa has ended")

    def test_an_allreduce_run_printing_a_muster_poll_line_that_fails_raises_training_failed(self):
        if not shutil.which("mpirun"):
            self.skipTest("Open MPI's mpirun is not installed")
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"), OMPI_ALLOW_RUN_AS_ROOT="1",
                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        c = self.client("rc-ar-poll")
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(2, 0, 0.5, 0.25, mode="allreduce", output=lambda line: None, command=[
                "sh", "-c", 'echo "muster: poll: x"; echo "muster: poll: x" >&2; '
                            'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 3; fi; sleep 30'])
        self.assertEqual(e.exception.code, "training_failed")
        self.assertRegex(e.exception.message, r"^rank 1 \(w-[a-z0-9]+\) exited with code 3$")

    def test_an_allreduce_rank_that_fails_raises_naming_the_rank_its_worker_and_the_cause(self):
        # mpirun's exit code alone ("mpirun exited with code 3") named none of them.
        if not shutil.which("mpirun"):
            self.skipTest("Open MPI's mpirun is not installed")
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"), OMPI_ALLOW_RUN_AS_ROOT="1",
                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        c = self.client("rc-ar")
        with self.assertRaises(muster.MusterError) as e:
            c.run_cluster(2, 0, 0.5, 0.25, mode="allreduce", output=lambda line: None, command=[
                "sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 3; fi; sleep 30'])
        self.assertEqual(e.exception.code, "training_failed")
        self.assertRegex(e.exception.message, r"^rank 1 \(w-[a-z0-9]+\) exited with code 3$")


class CmlBlogFlow(MusterTestCase):
    def test_launch_two_await_completion_and_read_logs(self):
        # As in the CML blog post, through the module functions and the
        # environment a CML session would have.
        self.env(MUSTER_URL=CTL["url"], MUSTER_TOKEN=CTL["token"], MUSTER_SESSION="blog")
        workers = _note(cdsw.launch_workers(
            n=2, cpu=0.2, memory=0.5,
            code="import os; print('Hello from', os.environ['CDSW_IP_ADDRESS'])"))
        self.addCleanup(lambda: _note(cdsw.stop_workers(*workers)))
        self.assertEqual(len(workers), 2)
        for w in workers:
            self.assertRegex(w["id"], r"^w-[a-z0-9]{10}$")
            self.assertEqual(w["session"], "blog")
            self.assertEqual(w["cpu"], 0.2)
            self.assertEqual(w["memory"], 0.5)
            # "python3" is the notebook's own interpreter.
            self.assertEqual(w["kernel"], sys.executable)
            self.assertIsNone(w["script"])
        done = cdsw.await_workers(workers, wait_for_completion=True, timeout_seconds=30)
        _note(done["workers"])
        self.assertEqual(done["failures"], [])
        self.assertFalse(done["timed_out"])
        self.assertEqual(sorted(w["id"] for w in done["workers"]),
                         sorted(w["id"] for w in workers))
        for w in done["workers"]:
            self.assertEqual(w["status"], "succeeded")
            self.assertEqual(w["exit_code"], 0)
            self.assertEqual(cdsw.worker_logs(w["id"]), "Hello from %s\n" % w["ip_address"])
            self.assertEqual(cdsw.worker_logs(w, stream="stderr"), "")
        self.assertEqual(sorted(w["id"] for w in cdsw.list_workers()),
                         sorted(w["id"] for w in workers))
        self.assertEqual(cdsw.get_worker(workers[0])["status"], "succeeded")


class WhereWorkersStart(MusterTestCase):
    """A notebook in ~/project: its workers start there (not in the
    controller's --workdir), run its own interpreter and find its scripts
    and commands, as CML's workers share the session's project directory."""

    def setUp(self):
        self.project = os.path.realpath(tempfile.mkdtemp(prefix="muster-project-"))
        os.chmod(self.project, 0o755)  # the workers' account reads it
        self.addCleanup(shutil.rmtree, self.project, True)
        with open(os.path.join(self.project, "where.py"), "w") as f:
            f.write("import json, os, sys\n"
                    "print(json.dumps({'cwd': os.getcwd(), 'exe': sys.executable}))\n")
        back = os.getcwd()
        os.chdir(self.project)
        self.addCleanup(os.chdir, back)

    def test_launch_workers_with_a_relative_script_from_another_directory_runs_it_there(self):
        c = self.client("where")
        ws = self.launch(c, 1, 0.2, 0.25, script="where.py")
        self.assertEqual(ws[0]["cwd"], self.project)
        done = c.await_workers(ws, timeout_seconds=30)
        self.assertEqual(done["failures"], [])
        self.assertEqual(json.loads(c.worker_logs(ws[0]["id"])),
                         {"cwd": self.project, "exe": sys.executable})

    def test_a_missing_script_fails_with_script_not_found(self):
        c = self.client("where")
        ws = self.launch(c, 1, 0.2, 0.25, script="fail.py")
        done = c.await_workers(ws, timeout_seconds=30)
        self.assertEqual([f["failure"] for f in done["failures"]],
                         ["script %s not found" % os.path.join(self.project, "fail.py")])

    def test_run_cluster_with_a_relative_worker_script_runs_it_there(self):
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"))
        c = self.client("where-rc")
        res = c.run_cluster(1, 0, 0.1, 0.25, mode="exec", worker_script="where.py",
                            output=lambda line: None)
        self.assertEqual(res["summary"], {"cwd": self.project, "exe": sys.executable})

    def test_muster_send_cwd_and_path_0_leave_the_workers_in_the_controllers_workdir(self):
        self.env(MUSTER_SEND_CWD="0", MUSTER_SEND_PATH="0")
        ws = self.launch(self.client("where"), 1, 0.2, 0.25)
        self.assertEqual((ws[0]["cwd"], ws[0]["path"]), (None, None))

    def test_launch_workers_with_cwd_and_path_empty_sends_neither(self):
        ws = self.launch(self.client("where"), 1, 0.2, 0.25, cwd="", path="")
        self.assertEqual((ws[0]["cwd"], ws[0]["path"]), (None, None))

    def test_the_path_sent_has_no_empty_or_dot_entries(self):
        with mock.patch.dict(os.environ, {"PATH": ":/usr/bin:.::/bin:"}):
            ws = self.launch(self.client("where"), 1, 0.2, 0.25)
        self.assertEqual(ws[0]["path"], "/usr/bin:/bin")

    def test_a_deleted_notebook_directory_raises_muster_error_naming_cwd(self):
        gone = tempfile.mkdtemp(prefix="muster-gone-")
        os.chdir(gone)
        os.rmdir(gone)
        with self.assertRaises(muster.MusterError) as e:
            self.client("where").launch_workers(1, 0.2, 0.25)
        self.assertEqual((e.exception.code, e.exception.field), ("invalid_value", "cwd"))
        self.assertIn("pass cwd=", e.exception.message)

    def test_a_path_that_is_not_utf8_raises_muster_error_naming_path(self):
        bad = os.fsdecode(b"/opt/j\xfcrgen/bin") + ":/usr/bin"
        with mock.patch.dict(os.environ, {"PATH": bad}):
            with self.assertRaises(muster.MusterError) as e:
                self.client("where").launch_workers(1, 0.2, 0.25)
        self.assertEqual((e.exception.code, e.exception.field), ("invalid_value", "path"))
        self.assertIn("not UTF-8", e.exception.message)


class OwnKernel(unittest.TestCase):
    """The default kernel is this process's interpreter only where that is
    a python: embedded hosts (uwsgi, apache) get "python3"."""

    def test_an_embedded_hosts_executable_is_not_the_kernel(self):
        for exe in ("/usr/bin/uwsgi", "/usr/sbin/apache2", ""):
            with mock.patch.object(sys, "executable", exe):
                self.assertEqual(muster._common._own_kernel(), "python3", exe)

    def test_a_python_that_cannot_be_run_is_not_the_kernel(self):
        with mock.patch.object(sys, "executable", "/nonexistent/bin/python3"):
            self.assertEqual(muster._common._own_kernel(), "python3")


class AwaitRunning(MusterTestCase):
    def test_idle_workers_come_up_with_distinct_ips(self):
        c = self.client("running")
        workers = self.launch(c, 2, 0.2, 0.5)  # CML's positional n, cpu, memory
        self.assertTrue(all(w["code"] is None and w["command"] is None for w in workers))
        up = c.await_workers([w["id"] for w in workers], wait_for_completion=False,
                             timeout_seconds=30)
        _note(up["workers"])
        self.assertEqual(up["failures"], [])
        self.assertFalse(up["timed_out"])
        self.assertEqual(len(up["workers"]), 2)
        ips = [w["ip_address"] for w in up["workers"]]
        self.assertTrue(all(w["status"] == "running" for w in up["workers"]))
        self.assertTrue(all(ip and ip.startswith("127.") for ip in ips), ips)
        self.assertEqual(len(set(ips)), 2, ips)
        # Stop them by passing the dicts, as returned.
        stopped = c.stop_workers(*up["workers"])
        self.assertEqual(sorted(w["id"] for w in stopped), sorted(w["id"] for w in workers))
        self.assertTrue(all(w["status"] == "stopped" for w in stopped), stopped)

    def test_await_single_id_and_socket_timeout_beyond_server_timeout(self):
        # Fill the 8 cores, so the next worker stays in `scheduling`.
        c = self.client("capacity")
        big = self.launch(c, 1, 8, 0.5)[0]
        up = c.await_workers(big, wait_for_completion=False, timeout_seconds=30)
        self.assertEqual([w["id"] for w in up["workers"]], [big["id"]])
        waiting = self.launch(c, 1, 1, 0.5)[0]
        # The client's own call timeout is shorter than the server's await:
        # await must still get the server's answer.
        c.timeout = 0.3
        self.addCleanup(setattr, c, "timeout", muster.DEFAULT_TIMEOUT)
        t0 = time.monotonic()
        r = c.await_workers(waiting["id"], wait_for_completion=False, timeout_seconds=1)
        elapsed = time.monotonic() - t0
        self.assertTrue(r["timed_out"])
        self.assertEqual(r["workers"], [])
        self.assertEqual([(w["id"], w["status"]) for w in r["failures"]],
                         [(waiting["id"], "scheduling")])
        self.assertGreaterEqual(elapsed, 0.9)
        self.assertLess(elapsed, 5)


    def test_an_await_timeout_says_what_each_waiting_worker_waits_for(self):
        # The controller knew why a worker waited; await said only
        # "timed_out" and the worker's status.
        c = self.client("waits")
        big = self.launch(c, 1, 8, 0.5)[0]
        c.await_workers(big, wait_for_completion=False, timeout_seconds=30)
        waiting = self.launch(c, 1, 1, 0.5)[0]
        r = c.await_workers(waiting, wait_for_completion=False, timeout_seconds=1)
        self.assertTrue(r["timed_out"])
        self.assertEqual(r["waiting_for"], {waiting["id"]: "1 core (0 free of 8)"})


class Failures(MusterTestCase):
    def test_failing_code_lands_in_failures_with_exit_code(self):
        c = self.client("failing")
        ws = self.launch(c, n=1, cpu=0.2, memory=0.5, code="import sys; sys.exit(3)")
        r = c.await_workers(ws, timeout_seconds=30)
        _note(r["failures"])
        self.assertEqual(r["workers"], [])
        self.assertFalse(r["timed_out"])
        self.assertEqual(len(r["failures"]), 1)
        f = r["failures"][0]
        self.assertEqual(f["id"], ws[0]["id"])
        self.assertEqual(f["status"], "failed")
        self.assertEqual(f["exit_code"], 3)
        self.assertTrue(f["failure"])

    def test_a_traceback_s_last_line_is_in_the_failure(self):
        c = self.client("failing")
        ws = self.launch(c, n=1, cpu=0.2, memory=0.5, code="1/0")
        r = c.await_workers(ws, timeout_seconds=30)
        _note(r["failures"])
        self.assertEqual(len(r["failures"]), 1)
        f = r["failures"][0]["failure"]
        self.assertTrue(f.startswith("the script exited with code 1; its stderr ended with:\n"), f)
        self.assertTrue(f.endswith("\nZeroDivisionError: division by zero"), f)
        self.assertIn("Traceback (most recent call last):", f)


class Stop(MusterTestCase):
    def test_stop_without_ids_stops_the_sessions_live_workers_only(self):
        mine = self.client("stopper")
        other = self.client("bystander")
        ws = self.launch(mine, 2, 0.2, 0.5)
        keep = self.launch(other, 1, 0.2, 0.5)
        up = mine.await_workers(ws + keep, wait_for_completion=False, timeout_seconds=30)
        self.assertEqual(len(up["workers"]), 3, up)
        _note(up["workers"])
        stopped = mine.stop_workers()
        self.assertEqual(sorted(w["id"] for w in stopped), sorted(w["id"] for w in ws))
        self.assertTrue(all(w["status"] == "stopped" for w in stopped), stopped)
        self.assertEqual(other.get_worker(keep[0]["id"])["status"], "running")
        listed = mine.list_workers()
        self.assertEqual(sorted(w["id"] for w in listed), sorted(w["id"] for w in ws))
        self.assertEqual([w["id"] for w in mine.list_workers(status="running")], [])
        self.assertIn(keep[0]["id"], [w["id"] for w in mine.list_workers(all_sessions=True)])
        # A list of dicts, as launch_workers returned it, is accepted too.
        self.assertEqual([w["status"] for w in other.stop_workers(keep)], ["stopped"])


class _NotJson(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<html>not muster</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Errors(MusterTestCase):
    def test_n_zero_is_invalid_value_naming_n(self):
        with self.assertRaises(muster.MusterError) as cm:
            self.client("errors").launch_workers(n=0, cpu=1, memory=1)
        e = cm.exception
        self.assertEqual((e.code, e.field, e.status), ("invalid_value", "n", 422))
        self.assertTrue(e.message)
        self.assertEqual(str(e), "invalid_value: %s (field: n)" % e.message)

    def test_negative_cpu_message(self):
        with self.assertRaises(cdsw.MusterError) as cm:
            self.client("errors").launch_workers(1, -1, 1)
        self.assertEqual(str(cm.exception),
                         "invalid_value: cpu must be between 0.01 and 4096 cores (got -1) (field: cpu)")

    def test_bad_token_is_unauthorized(self):
        with self.assertRaises(muster.MusterError) as cm:
            self.client("errors", token="not-the-token").list_workers()
        self.assertEqual((cm.exception.code, cm.exception.status), ("unauthorized", 401))

    def test_unknown_worker_is_not_found(self):
        with self.assertRaises(muster.MusterError) as cm:
            self.client("errors").get_worker("w-zzzzzzzzzz")
        self.assertEqual((cm.exception.code, cm.exception.status), ("not_found", 404))

    def test_bad_worker_argument_is_refused_before_sending(self):
        with self.assertRaises(muster.MusterError) as cm:
            self.client("errors").stop_workers(42)
        self.assertEqual((cm.exception.code, cm.exception.status), ("invalid_value", None))

    def test_nobody_listening_is_unreachable(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        with self.assertRaises(muster.MusterError) as cm:
            muster.Client(url="http://127.0.0.1:%d" % port, token="x").list_workers()
        self.assertEqual(cm.exception.code, "unreachable")
        self.assertIsNone(cm.exception.status)
        self.assertIn("MUSTER_URL", cm.exception.message)

    def test_a_non_json_answer_is_a_protocol_error(self):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotJson)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        with self.assertRaises(muster.MusterError) as cm:
            muster.Client(url="http://127.0.0.1:%d" % srv.server_address[1],
                          token="x").list_workers()
        self.assertEqual((cm.exception.code, cm.exception.status), ("protocol_error", 200))


class Discovery(MusterTestCase):
    def test_from_state_dir(self):
        self.env(MUSTER_STATE_DIR=CTL["state_dir"], MUSTER_SESSION="disc")
        c = muster.Client()
        self.assertEqual((c.url, c.token, c.session), (CTL["url"], CTL["token"], "disc"))
        self.assertEqual(cdsw.list_workers(), [])  # the module's default client
        self.assertEqual(muster.default_client().session, "disc")

    def test_environment_wins_over_state_dir(self):
        self.env(MUSTER_STATE_DIR=CTL["state_dir"], MUSTER_URL="http://127.0.0.1:9",
                 MUSTER_TOKEN="tok")
        c = muster.Client()
        self.assertEqual((c.url, c.token), ("http://127.0.0.1:9", "tok"))
        # No MUSTER_SESSION: a session of the process's own (host, pid, random).
        self.assertRegex(c.session, r"^[A-Za-z0-9_.-]+-%d-[a-z0-9]{6}$" % os.getpid())
        self.assertNotEqual(c.session, muster.Client().session)

    def test_no_controller_anywhere_is_unreachable(self):
        home = tempfile.mkdtemp(prefix="muster-pytest-home-")
        self.addCleanup(shutil.rmtree, home, True)
        self.env(HOME=home)  # no MUSTER_*: the default ~/.muster, which is empty
        with self.assertRaises(muster.MusterError) as cm:
            cdsw.launch_workers(1, 1, 1)
        e = cm.exception
        self.assertEqual(e.code, "unreachable")
        self.assertIn(os.path.join(home, ".muster", "url"), e.message)
        self.assertIn("muster-controller", e.message)
        self.assertIn("MUSTER_URL", e.message)


# A notebook kernel: a client of its own session (no MUSTER_SESSION), with a
# short lease, launches 3 idle workers, prints their ids once they run, then
# waits for a line on stdin: "exit" exits cleanly, anything else never comes
# (the test kills it).
_KERNEL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import muster
c = muster.Client(url=sys.argv[2], token=sys.argv[3], lease_ttl=float(sys.argv[4]),
                  lease=sys.argv[5] == "on")
ws = c.launch_workers(3, 0.1, 0.1)
done = c.await_workers(ws, wait_for_completion=False, timeout_seconds=30)
print(json.dumps({"session": c.session, "ids": [w["id"] for w in done["workers"]]}), flush=True)
sys.stdin.readline()
"""


class Metrics(MusterTestCase):
    """log_metrics() in a run's processes, and a run's metrics read back."""

    def setUp(self):
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"))
        self.addCleanup(self._stop_sender)
        muster._metrics._metrics_sender = muster._metrics._metrics_append = None

    @staticmethod
    def _stop_sender():
        if muster._metrics._metrics_sender:
            muster._metrics._metrics_sender.close()
        muster._metrics._metrics_sender = muster._metrics._metrics_append = None

    def test_every_rank_of_a_run_logs_its_points_and_they_read_back(self):
        d = tempfile.mkdtemp(prefix="muster-pytest-metrics-")
        self.addCleanup(shutil.rmtree, d, True)
        os.chmod(d, 0o755)
        script = os.path.join(d, "train.py")
        with open(script, "w") as f:
            f.write("import sys\nsys.path.insert(0, %r)\nimport muster\n"
                    "for i in range(300):\n"
                    "    muster.log_metrics(i, epoch=i / 100, loss=1.0 / (i + 1), acc=i / 300)\n"
                    "print('{\"logged\": 300}')\n" % os.path.join(REPO, "sdk", "python"))
        os.chmod(script, 0o644)
        c = self.client("metrics")
        res = c.run_cluster(2, 0, 0.2, 0.25, mode="exec", command=["/usr/bin/python3", script])
        self.assertEqual(res["summary"], {"logged": 300})
        got = c.run_metrics(res["run"], names="loss")["points"]
        for rank in (0, 1):
            mine = [p for p in got if p["rank"] == rank]
            self.assertEqual([p["step"] for p in mine], list(range(300)), rank)
            self.assertAlmostEqual(mine[-1]["values"]["loss"], 1.0 / 300)
            self.assertAlmostEqual(mine[-1]["epoch"], 2.99)
        few = c.run_metrics(res["run"], names=["loss"], max_points=10)["points"]
        self.assertEqual(len(few), 20)  # 10 per rank
        self.assertEqual(max(p["max"]["loss"] for p in few), 1.0)

    def _hanging_controller(self):
        """A socket that takes connections and never answers."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        self.addCleanup(s.close)
        return "http://127.0.0.1:%d" % s.getsockname()[1]

    def test_a_controller_that_does_not_answer_never_blocks_the_training_loop(self):
        self.env(MUSTER_CONTROLLER_URL=self._hanging_controller(), MUSTER_RUN_ID="r-0123456789",
                 MUSTER_RUN_TOKEN="mr_x", RANK="3")
        worst = 0.0
        for step in range(20000):
            t = time.perf_counter()
            muster.log_metrics(step, loss=1.0 / (step + 1))
            worst = max(worst, time.perf_counter() - t)
            if step % 1000 == 0:
                time.sleep(0.05)  # the sender's second passes meanwhile
        # A call that sent, or waited for the sender, would take its 10 s
        # timeout here; each took at most a few milliseconds (a GC pause).
        self.assertLess(worst, 0.5, "a log_metrics() call took %.3f s" % worst)
        self.assertEqual(muster._metrics._metrics_sender.dropped, 0)  # all kept for later

    def test_points_logged_while_the_controller_is_stopped_arrive_once_it_answers(self):
        c = self.client("metrics-stop", lease=True)
        c.launch_workers(1, 0.1, 0.1)  # takes the lease: a run needs a holder
        run = c._request("POST", "/api/v1/runs", body={
            "mode": "exec", "command": ["train"], "session": c.session,
            "holder": c._lease_holder})
        self.env(MUSTER_CONTROLLER_URL=CTL["url"], MUSTER_RUN_ID=run["id"],
                 MUSTER_RUN_TOKEN=None, MUSTER_TOKEN=CTL["token"])
        os.kill(CTL["proc"].pid, signal.SIGSTOP)
        try:
            for step in range(100):
                muster.log_metrics(step, loss=float(step))
            self.assertFalse(muster.flush_metrics(timeout=0.5))
        finally:
            os.kill(CTL["proc"].pid, signal.SIGCONT)
        self.assertTrue(muster.flush_metrics(timeout=10))
        got = c.run_metrics(run["id"])["points"]
        self.assertEqual([p["step"] for p in got], list(range(100)))

    def test_outside_a_run_log_metrics_says_what_it_needs(self):
        self.env(MUSTER_URL=CTL["url"], MUSTER_TOKEN=CTL["token"])
        with self.assertRaises(muster.MusterError) as e:
            muster.log_metrics(1, loss=0.5)
        self.assertEqual(e.exception.code, "not_found")
        self.assertIn("MUSTER_RUN_ID", str(e.exception))


class Leases(MusterTestCase):
    """Workers end with the Python process that launched them, as in CML."""

    TTL = 3

    def kernel(self, lease="on"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        p = subprocess.Popen([sys.executable, "-c", _KERNEL, os.path.join(REPO, "sdk", "python"),
                              CTL["url"], CTL["token"], str(self.TTL), lease],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.addCleanup(lambda: (p.poll() is None and (p.kill(), p.wait()), p.stdin.close(),
                                 p.stdout.close()))
        line = p.stdout.readline()
        self.assertTrue(line, "the kernel printed nothing (exit %s)" % p.poll())
        info = json.loads(line)
        self.assertEqual(len(info["ids"]), 3, info)
        c = self.client(info["session"])
        self.addCleanup(lambda: _note(c.stop_workers(*info["ids"])))
        _note([c.get_worker(i) for i in info["ids"]])
        return p, info, c

    def statuses(self, c, ids):
        return sorted(c.get_worker(i)["status"] for i in ids)

    def test_a_killed_process_stops_its_workers_within_ttl_with_the_lease_sentence(self):
        p, info, c = self.kernel()
        killed = time.time()
        p.kill()
        p.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.TTL + 30 and \
                self.statuses(c, info["ids"]) != ["stopped"] * 3:
            time.sleep(0.05)
        ws = [c.get_worker(i) for i in info["ids"]]
        self.assertEqual([w["status"] for w in ws], ["stopped"] * 3)
        # Timed as the controller recorded the end, not by this loop's
        # polling, which a loaded machine slows.
        ended = max(datetime.datetime.strptime(w["finished_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
                    .replace(tzinfo=datetime.timezone.utc).timestamp() for w in ws)
        self.assertLessEqual(ended - killed, self.TTL + 2)
        self.assertEqual({w["failure"] for w in ws}, {"stopped: the session's lease expired"})

    def test_a_clean_exit_stops_them_at_once(self):
        p, info, c = self.kernel()
        p.stdin.write("exit\n")
        p.stdin.flush()
        self.assertEqual(p.wait(timeout=20), 0)
        # By the time the process has exited, they are stopped.
        self.assertEqual(self.statuses(c, info["ids"]), ["stopped"] * 3)
        s = c._request("GET", "/api/v1/sessions/" + info["session"])
        self.assertIsNone(s["lease"])

    def has_lease(self, c, session):
        return any(s["name"] == session and s["lease"]
                   for s in c._request("GET", "/api/v1/sessions")["sessions"])

    def test_the_opt_out_keeps_them(self):
        p, info, c = self.kernel(lease="off")
        p.kill()
        p.wait()
        # A lease of the same ttl, taken now and renewed by nobody: once it
        # ran out, the controller went past the end that a lease of the
        # killed process would have had.
        clock = "opt-out-clock"
        c._request("PUT", "/api/v1/sessions/%s/lease" % clock, {"ttl_seconds": self.TTL})
        deadline = time.monotonic() + self.TTL + 10
        while self.has_lease(c, clock):
            self.assertLess(time.monotonic(), deadline,
                            "the lease of session %s (ttl %s s) did not run out within %s s"
                            % (clock, self.TTL, self.TTL + 10))
            time.sleep(0.05)
        self.assertEqual(self.statuses(c, info["ids"]), ["running"] * 3)

    def test_two_clients_without_a_session_name_neither_list_nor_stop_each_others(self):
        self.env(MUSTER_URL=CTL["url"], MUSTER_TOKEN=CTL["token"])
        a, b = muster.Client(lease=False), muster.Client(lease=False)
        self.assertNotEqual(a.session, b.session)
        wa = self.launch(a, 1, 0.1, 0.1)
        wb = self.launch(b, 1, 0.1, 0.1)
        a.await_workers(wa + wb, wait_for_completion=False, timeout_seconds=20)
        self.assertEqual([w["id"] for w in a.list_workers()], [wa[0]["id"]])
        self.assertEqual([w["id"] for w in b.list_workers()], [wb[0]["id"]])
        self.assertEqual([w["id"] for w in a.stop_workers()], [wa[0]["id"]])
        self.assertEqual(b.get_worker(wb[0]["id"])["status"], "running")

    def test_run_cluster_records_its_run_and_restarts(self):
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"))
        c = self.client("rc-restart", lease=True)
        res = c.run_cluster(2, 0, 0.1, 0.25, mode="exec", output=lambda line: None, max_restarts=1,
                            command=["sh", "-c", 'if [ "$MUSTER_RESTART_COUNT" = 0 ] && '
                                     '[ "$RANK" = 1 ]; then exit 4; fi; echo \'{"ok": 1}\''])
        self.assertEqual((res["exit_code"], res["restarts"], res["summary"]), (0, 1, {"ok": 1}))
        run = c.get_run(res["run"])
        self.assertEqual((run["status"], run["restarts"], run["mode"]), ("succeeded", 1, "exec"))
        self.assertIn("exited with code 4", run["causes"][0]["cause"])
        self.assertEqual(len(run["workers"]), 4)
        self.assertIn(res["run"], [r["id"] for r in c.list_runs()])
        # The client's lease covers the run: muster run did not give it back.
        self.assertIsNotNone(c._request("GET", "/api/v1/sessions/rc-restart")["lease"])


class CdswCompatibility(unittest.TestCase):
    def test_cml_signatures(self):
        # cdsw.launch_workers(n, cpu, memory, nvidia_gpu=0, kernel="python3",
        #                     script="", code="", env={})
        p = list(inspect.signature(cdsw.launch_workers).parameters.values())
        self.assertEqual([(x.name, x.default) for x in p[:8]],
                         [("n", inspect.Parameter.empty), ("cpu", inspect.Parameter.empty),
                          ("memory", inspect.Parameter.empty), ("nvidia_gpu", 0),
                          ("kernel", "python3"), ("script", ""), ("code", ""), ("env", {})])
        p = list(inspect.signature(cdsw.await_workers).parameters.values())
        self.assertEqual([(x.name, x.default) for x in p[:3]],
                         [("ids", inspect.Parameter.empty), ("wait_for_completion", True),
                          ("timeout_seconds", 60)])
        p = list(inspect.signature(cdsw.stop_workers).parameters.values())
        self.assertEqual([(x.name, x.kind) for x in p],
                         [("worker_id", inspect.Parameter.VAR_POSITIONAL)])
        # CML's list_workers() takes no argument: muster's extras all have defaults.
        self.assertTrue(all(x.default is not inspect.Parameter.empty for x in
                            inspect.signature(cdsw.list_workers).parameters.values()))
        for name in ("launch_workers", "await_workers", "stop_workers", "list_workers",
                     "get_worker", "worker_logs", "Client", "MusterError"):
            self.assertTrue(getattr(cdsw, name).__doc__, name + " has no docstring")

    def test_stdlib_only(self):
        import ast
        pkg = os.path.dirname(muster.__file__)
        imports = set()
        for name in sorted(os.listdir(pkg)):
            if name.endswith(".py"):
                with open(os.path.join(pkg, name)) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        imports |= {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.level == 0:
                        imports.add(node.module.split(".")[0])
        # pandas and IPython only where present: a DataFrame, a notebook's display.
        self.assertLessEqual(imports, set(sys.stdlib_module_names) | {"pandas", "IPython"},
                             imports - set(sys.stdlib_module_names))


class WhatAWorkerSaysCannotDriveTheTerminal(unittest.TestCase):
    def test_an_errors_text_writes_control_characters_out_and_keeps_lines(self):
        e = muster.MusterError("training_failed",
                               "rank 1 (w-x) failed:\n    \x1b]0;pwned\x07\x1b[2J\x9bfake")
        self.assertEqual(str(e), "training_failed: rank 1 (w-x) failed:\n    "
                                 "\\x1b]0;pwned\\x07\\x1b[2J\\u009bfake")


if __name__ == "__main__":
    unittest.main()
