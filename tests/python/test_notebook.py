"""The Python client as a notebook user meets it, against a real controller:
workers, waits, runs and the client shown as tables; a wait's progress on a
terminal; a KeyboardInterrupt that ends a wait at once and leaves the
workers running; the Run object of run_cluster.

    MUSTER_BUILD_DIR=build python3 -m unittest -v tests/python/test_notebook.py

The controller and the cleanup are test_muster's (setUpModule,
tearDownModule)."""

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_muster import (BUILD_DIR, CTL, REPO, MusterTestCase, _note,  # noqa: E402,F401
                         muster, setUpModule, tearDownModule)

SDK = os.path.join(REPO, "sdk", "python")
PY = "/usr/bin/python3"

# A worker's code that logs metrics as rank RANK and prints its rank.
_RANK_CODE = ("import os, sys, time\nsys.path.insert(0, %r)\nimport muster\n"
              "for i in range(5):\n    muster.log_metrics(i, loss=1.0 / (i + 1))\n"
              "muster.flush_metrics()\nprint('rank', os.environ['RANK'])\n" % SDK)


def _readline(p, seconds=120):
    """p's next line of output, or "" if none came within seconds (a
    thread reads it: the pipe is text, select() would miss its buffer)."""
    got = []
    t = threading.Thread(target=lambda: got.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(seconds)
    return got[0] if got else ""


def _read_tty(fd, seen, quiet, want=None, seconds=60):
    """seen plus what the terminal fd gives: until want is in it (at most
    seconds), or, without want, until it says nothing for quiet seconds."""
    deadline = time.monotonic() + seconds
    while (want is None or want not in seen) and time.monotonic() < deadline:
        if not select.select([fd], [], [], quiet)[0]:
            if want is None:
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child's end closed
            break
        if not chunk:
            break
        seen += chunk
    return seen


def _columns(line):
    """The offsets where the columns of an aligned line start."""
    return [m.start() for m in re.finditer(r"(?:^|  )(\S)", line)]


class Display(MusterTestCase):
    """Lists of workers, a wait's answer, a run and the client render as
    tables, and stay the plain lists and dicts CML code indexes."""

    def test_running_workers_are_an_html_table_and_aligned_text_and_still_plain_dicts(self):
        c = self.client("display")
        ws = self.launch(c, 2, 0.1, 0.1)
        done = c.await_workers(ws, wait_for_completion=False, timeout_seconds=60)
        # What CML code does with the answer works as before.
        self.assertIsInstance(done, dict)
        self.assertIsInstance(done["workers"], list)
        self.assertEqual(len(done["workers"]), 2)
        ips = [w["ip_address"] for w in done["workers"]]
        self.assertTrue(all(re.fullmatch(r"127(\.\d+){3}", ip) for ip in ips), ips)
        json.loads(json.dumps(done))  # still JSON

        page = done["workers"]._repr_html_()
        self.assertIn("<table", page)
        for w in done["workers"]:
            self.assertIn('href="%s/#/workers/%s"' % (c.url, w["id"]), page)
            self.assertIn(w["ip_address"], page)
        self.assertEqual(page.count("muster-worker muster-running"), 2, page)
        self.assertIn("0.1 CPU, 0.1 GiB", page)
        self.assertIn("#1a7f37", page)  # running's colour

        text = repr(done["workers"]).splitlines()
        # (USAGE too, once the workers' first sample is in)
        self.assertEqual(text[0].split()[:5], ["ID", "STATUS", "IP", "ROLE", "RESOURCES"])
        self.assertEqual(len(text), 3)
        self.assertEqual(_columns(text[1]), _columns(text[0]))
        self.assertEqual(_columns(text[2]), _columns(text[0]))
        self.assertIn("2 reached the target, 0 did not (2 running)", repr(done))
        self.assertIn(done["workers"][0]["id"], c.list_workers()._repr_html_())
        self.assertIn(ws[0]["id"], repr(c.get_worker(ws[0])))

    def test_a_failed_workers_sentence_and_a_waiting_workers_reason_are_shown(self):
        c = self.client("display-failed")
        bad = self.launch(c, 1, 0.1, 0.1, code="raise SystemExit('the data is missing')")
        done = c.await_workers(bad, timeout_seconds=60)
        self.assertIn("the data is missing", done._repr_html_())
        self.assertIn("muster-failed", done._repr_html_())
        self.assertIn("the data is missing", repr(done))
        self.assertIn("1 failed", repr(done))

        big = self.launch(c, 1, 8, 0.1)
        c.await_workers(big, wait_for_completion=False, timeout_seconds=30)
        waiting = self.launch(c, 1, 1, 0.1)
        r = c.await_workers(waiting, wait_for_completion=False, timeout_seconds=0.5)
        self.assertIn("waits for 1 core (0 free of 8)", r._repr_html_())
        self.assertIn("waits for 1 core (0 free of 8)", repr(r))
        self.assertIn("the wait timed out", repr(r))

    def test_the_client_shows_its_controller_session_and_workers(self):
        c = self.client("display-client")
        ws = self.launch(c, 1, 0.1, 0.1)
        c.await_workers(ws, wait_for_completion=False, timeout_seconds=60)
        page = c._repr_html_()
        self.assertIn(c.url, page)
        self.assertIn("display-client", page)
        self.assertIn("1 running", page)
        self.assertIn("muster %s" % muster.__version__, page)

    def test_a_workers_text_cannot_drive_the_terminal(self):
        c = self.client("display-escape")
        bad = self.launch(c, 1, 0.1, 0.1, code="raise SystemExit('\\x1b[2J<b>gone</b>')")
        done = c.await_workers(bad, timeout_seconds=60)
        self.assertNotIn("\x1b", repr(done))
        self.assertNotIn("<b>gone</b>", done._repr_html_())
        self.assertIn("&lt;b&gt;gone&lt;/b&gt;", done._repr_html_())


# A notebook kernel's wait, run as its own process: launches, says so, then
# awaits (until the test interrupts it) and says how it ended.
_AWAIT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import muster
c = muster.Client(url=sys.argv[2], token=sys.argv[3], session=sys.argv[4])
ws = c.launch_workers(2, 0.1, 0.1, code=sys.argv[5])
print(json.dumps([w["id"] for w in ws]), flush=True)
progress = {"auto": None, "on": True}[sys.argv[6]]
try:
    done = c.await_workers(ws, wait_for_completion=True, timeout_seconds=300, progress=progress)
    print("returned " + json.dumps({"at": time.monotonic(), "counts": repr(done)}), flush=True)
except KeyboardInterrupt as e:
    print("interrupted " + json.dumps({"at": time.monotonic(), "words": str(e)}), flush=True)
sys.stdin.readline()
"""


class Waiting(MusterTestCase):
    """A wait shows its progress where someone watches it, and a
    KeyboardInterrupt ends it at once."""

    def kernel(self, session, code, stderr=subprocess.PIPE, progress="auto"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        env["COLUMNS"] = "200"  # a new pty's size is 0x0: the line's width then
        p = subprocess.Popen([PY, "-c", _AWAIT, SDK, CTL["url"], CTL["token"], session, code,
                              progress],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                             env=env, text=True)
        self.addCleanup(lambda: (p.poll() is None and (p.kill(), p.wait()), p.stdin.close(),
                                 p.stdout.close(), p.stderr and p.stderr.close()))
        line = _readline(p)
        self.assertTrue(line, "the kernel printed nothing (exit %s)" % p.poll())
        ids = json.loads(line)
        c = self.client(session)
        self.addCleanup(lambda: self._stop_and_await(c, ids))
        return p, ids, c

    def test_sigint_ends_an_await_within_a_second_and_leaves_the_workers_running(self):
        # One long wait (no display), and half-second ones (a display).
        for progress in ("auto", "on"):
            with self.subTest(progress=progress):
                self.interrupt(progress)

    def interrupt(self, progress):
        p, ids, c = self.kernel("interrupt-" + progress, "import time; time.sleep(600)",
                                progress=progress)
        # Both running: the kernel's await (until they end) is under way.
        up = c.await_workers(ids, wait_for_completion=False, timeout_seconds=60)
        self.assertEqual(len(up["workers"]), 2, up)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = _readline(p)
        self.assertTrue(line.startswith("interrupted "), line)
        said = json.loads(line.split(" ", 1)[1])
        self.assertLess(said["at"] - sent, 1.0, "the wait ended %.2f s after SIGINT"
                        % (said["at"] - sent))
        self.assertIn("await_workers was interrupted", said["words"])
        self.assertIn("the 2 workers are left as they are", said["words"])
        self.assertIn("stop_workers(%r, %r)" % tuple(ids), said["words"])
        self.assertEqual([c.get_worker(i)["status"] for i in ids], ["running", "running"])
        self.assertIsNone(p.poll())  # the kernel goes on
        p.stdin.write("\n")
        p.stdin.flush()
        self.assertEqual(p.wait(timeout=30), 0)

    def test_on_a_terminal_the_wait_redraws_one_line_and_in_a_pipe_says_nothing(self):
        master, slave = pty.openpty()
        self.addCleanup(os.close, master)
        # Workers that run until they are stopped: however late the second
        # one starts, both run at once; they are stopped once the line said so.
        p, ids, c = self.kernel("progress-tty", "import time; time.sleep(600)", stderr=slave)
        os.close(slave)
        seen = _read_tty(master, b"", 1, want=b"2 running of 2 workers")
        self.assertIn(b"2 running of 2 workers", seen, "in 60 s")
        _note(c.stop_workers(*ids))
        self.assertTrue(_readline(p).startswith("returned "))
        p.stdin.write("\n")
        p.stdin.flush()
        self.assertEqual(p.wait(timeout=30), 0)
        seen = _read_tty(master, seen, 5)
        text = seen.decode()
        # Redrawn in place ("\r", erase line), one line in all, its last
        # state the outcome.
        self.assertGreaterEqual(text.count("\r\x1b[K"), 2, text)
        self.assertEqual(text.replace("\r\n", "\n").count("\n"), 1, text)
        last = text.rsplit("\r\x1b[K", 1)[1]
        self.assertRegex(last, r"^await_workers: 2 stopped of 2 workers; done\r?\n$")
        self.assertIn("2 running of 2 workers", text)

        p2, _, _ = self.kernel("progress-pipe", "print('hi')")
        self.assertTrue(_readline(p2).startswith("returned "))
        p2.stdin.write("\n")
        p2.stdin.flush()
        self.assertEqual(p2.wait(timeout=30), 0)
        self.assertEqual(p2.stderr.read(), "")


class RunObject(MusterTestCase):
    """run_cluster returns a Run: status, workers, wait, logs, metrics, stop."""

    def setUp(self):
        self.session = "run-" + self._testMethodName[5:40].replace("_", "-")
        self.env(MUSTER_CLI=os.path.join(BUILD_DIR, "muster"), MUSTER_URL=CTL["url"],
                 MUSTER_TOKEN=CTL["token"], MUSTER_SESSION=self.session, MUSTER_LEASE="0")
        c = self.client(self.session)
        self.addCleanup(lambda: self._stop_and_await(c, [w["id"] for w in c.list_workers(
            status=["scheduling", "starting", "running"])]))

    def until(self, what, check, seconds=60):
        """Waits for check() to be true (what: the words of a failure)."""
        deadline = time.monotonic() + seconds
        while not check():
            self.assertLess(time.monotonic(), deadline, "waited %d s for %s" % (seconds, what))
            time.sleep(0.05)  # polls the controller: there is no event to wait on here

    def test_a_finished_run_reads_back_its_status_workers_logs_and_metrics(self):
        lines = []
        run = muster.run_cluster(2, 0, 0.1, 0.1, mode="exec", command=[PY, "-c", _RANK_CODE],
                                 output=lines.append, progress=False)
        self.assertEqual(run["exit_code"], 0, lines)
        self.assertEqual(run.status, "succeeded")
        self.assertIs(run.wait(5), run)
        ws = run.workers
        self.assertEqual(len(ws), 2)
        self.assertEqual({w["run"] for w in ws}, {run.id})
        self.assertEqual(run.logs(1), "rank 1\n")
        rows = run.metrics()
        if not isinstance(rows, list):  # pandas is installed
            rows = rows.to_dict("records")
        self.assertEqual([(r["step"], r["rank"]) for r in rows],
                         [(s, k) for s in range(5) for k in (0, 1)])
        for got, want in zip([r["loss"] for r in rows if r["rank"] == 1],
                             [1.0, 0.5, 1 / 3, 0.25, 0.2]):
            self.assertAlmostEqual(got, want, places=6)
        page = run._repr_html_()
        self.assertIn('href="%s/#/runs/%s"' % (CTL["url"], run.id), page)
        self.assertIn("loss 0.2 (step 4)", page)
        self.assertIn("muster-worker", page)
        self.assertIn("status    succeeded", repr(run))

    def test_a_run_in_the_background_is_waited_for_and_stopped(self):
        run = muster.run_cluster(2, 0, 0.1, 0.1, mode="exec", command=["sleep", "300"],
                                 progress=False, wait=False)
        self.assertTrue(run.id and run.id.startswith("r-"), run)
        self.assertEqual(run.status, "running")
        self.assertIs(muster.attach_run(run.id), run)
        self.until("the run's 2 workers running", lambda: [
            w["status"] for w in run.workers] == ["running", "running"])
        with self.assertRaises(muster.MusterError) as e:
            run.wait(0.5)
        self.assertEqual(e.exception.code, "timeout")
        stopped = run.stop()
        self.assertEqual(len(stopped), 2)
        run.wait(60)
        self.assertEqual(run.status, "stopped")
        self.assertEqual({w["status"] for w in run.workers}, {"stopped"})
        self.assertNotEqual(run["exit_code"], 0)
        # A run found by its id alone reads back the same.
        other = muster.Client(session="someone-else").attach_run(run.id)
        self.assertEqual(other.status, "stopped")
        self.assertEqual(len(other.workers), 2)

    def test_an_output_callback_that_raises_stops_the_run_and_its_workers(self):
        def output(line):
            raise ValueError("the notebook's own bug")
        with self.assertRaisesRegex(ValueError, "the notebook's own bug"):
            muster.run_cluster(2, 0, 0.1, 0.1, mode="exec", output=output, progress=False,
                               command=[PY, "-c", "print('up', flush=True)\n"
                                        "import time; time.sleep(300)"])
        c = self.client(self.session)
        self.until("the run to end as stopped",
                   lambda: c.list_runs()[0]["status"] == "stopped")
        self.until("the run's workers to end", lambda: not c.list_workers(
            status=["scheduling", "starting", "running"]))

    def test_an_interrupted_run_cluster_leaves_the_run_going_on_and_says_how_to_get_it(self):
        code = ("import json, sys, time\nsys.path.insert(0, sys.argv[1])\nimport muster\n"
                "try:\n    muster.run_cluster(1, 0, 0.1, 0.1, mode='exec', "
                "command=['sleep', '300'], progress=False, output=lambda line: None)\n"
                "except KeyboardInterrupt as e:\n"
                "    print('interrupted ' + json.dumps({'at': time.monotonic(), "
                "'words': str(e)}), flush=True)\nsys.stdin.readline()\n")
        env = dict(os.environ, MUSTER_LEASE="1")
        p = subprocess.Popen([PY, "-c", code, SDK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=env, text=True)
        self.addCleanup(lambda: (p.poll() is None and (p.kill(), p.wait()), p.stdin.close(),
                                 p.stdout.close()))
        c = self.client(self.session)
        # Its worker running: the run is under way.
        self.until("the run's worker running", lambda: c.list_workers(status="running"))
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = _readline(p)
        self.assertTrue(line.startswith("interrupted "), line)
        said = json.loads(line.split(" ", 1)[1])
        # (its handler looks the run's id up: one call to the controller)
        self.assertLess(said["at"] - sent, 3.0)
        m = re.search(r"muster\.attach_run\('(r-[a-z0-9]{10})'\)", said["words"])
        self.assertTrue(m, said["words"])
        run = c.attach_run(m.group(1))
        self.assertEqual(run.status, "running")
        self.assertEqual([w["status"] for w in run.workers], ["running"])
        run.stop()
        self.assertEqual(run.wait(60).status, "stopped")
        p.stdin.write("\n")
        p.stdin.flush()
        self.assertEqual(p.wait(timeout=30), 0)


class _FakeProc:
    """What _Reader reads: a muster run whose lines come when let through."""

    def __init__(self, lines, fail_after=None):
        self.lines, self.fail_after = lines, fail_after
        self.gate = threading.Semaphore(0)
        self.pid, self.returncode, self.closed = 2 ** 22 + 1, None, False
        self.stdout = self

    def __iter__(self):
        for i, line in enumerate(self.lines):
            self.gate.acquire()
            if self.fail_after is not None and i >= self.fail_after:
                raise OSError(5, "Input/output error")
            yield line + "\n"

    def close(self):
        self.closed = True

    def poll(self):
        return self.returncode

    def wait(self):
        self.returncode = 0
        return 0


class Reader(unittest.TestCase):
    """run_cluster's reader of muster run's output, on a fake process."""

    def reader(self, proc, output):
        from muster._cluster import _Reader
        from muster._run import Run, RunOutput
        run = Run(None, {"exit_code": None, "summary": None, "run": None, "restarts": 0}, 1, 0)
        watch = SimpleNamespace(stop=threading.Event(), run_id=None)
        return run, _Reader(run, proc, RunOutput(), watch, output)

    def test_lines_reach_the_foreground_then_output_in_order_none_lost(self):
        got = []
        proc = _FakeProc(["a", "b", "c", "d"])
        run, r = self.reader(proc, got.append)
        proc.gate.release()
        self.assertEqual(r.next_line(), "a")
        proc.gate.release()
        proc.gate.release()
        # "b" and "c" may or may not have been read yet: either way they
        # reach output, in order, before "d".
        r.background()
        proc.gate.release()
        run._reader.join(10)
        self.assertFalse(run._reader.is_alive())
        self.assertEqual(got, ["b", "c", "d"])
        self.assertEqual(run.output, ["a", "b", "c", "d"])
        self.assertEqual(run["exit_code"], 0)
        self.assertTrue(proc.closed)
        self.assertIsNone(r.next_line())

    def test_an_unreadable_pipe_ends_the_run_with_a_reason_and_reaps_it(self):
        proc = _FakeProc(["a", "b"], fail_after=1)
        run, r = self.reader(proc, None)
        proc.gate.release()
        proc.gate.release()
        self.assertEqual(r.next_line(), "a")
        self.assertIsNone(r.next_line())
        run._reader.join(10)
        self.assertEqual(run["exit_code"], 1)  # failed, though the process said 0
        self.assertEqual(proc.returncode, 0)   # reaped
        self.assertTrue(proc.closed)
        self.assertIn("could not be read", r.out.failure)

    def test_an_output_callback_that_raises_is_dropped_and_the_lines_kept(self):
        calls = []

        def output(line):
            calls.append(line)
            raise RuntimeError("broken callback")
        proc = _FakeProc(["a", "b"])
        run, r = self.reader(proc, output)
        r.background()
        proc.gate.release()
        proc.gate.release()
        run._reader.join(10)
        self.assertEqual(calls, ["a"])
        self.assertEqual(run.output, ["a", "b"])


if __name__ == "__main__":
    unittest.main()
