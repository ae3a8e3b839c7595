"""run_cluster(): a training run through the ``muster run`` command line
tool, its output printed as it comes, its progress shown, and a Run back."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List, Optional

from ._common import _own_kernel
from ._errors import MusterError
from ._progress import Progress
from ._run import Run, RunOutput

_KEEP_LINES = 10000  # lines of a background run's output kept in run.output


def find_cli() -> str:
    """The muster command line tool: MUSTER_CLI, the build beside this
    source tree, or the PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    cli = os.environ.get("MUSTER_CLI") or next(
        (c for c in (os.path.join(here, "..", "..", "..", "build", "muster"),)
         if os.access(c, os.X_OK)), None) or shutil.which("muster")
    if not cli:
        raise MusterError("unreachable", "the muster command line tool was not found: set "
                          "MUSTER_CLI or put muster on the PATH")
    return cli


def cli_args(client: Any, n_workers: int, n_ps: int, cpu: float, memory: float, nvidia_gpu: int,
             worker_script: Optional[str], timeout_seconds: float, mode: Optional[str],
             command: Optional[List[str]], port: int, ps_cpu: Optional[float],
             ps_memory: Optional[float], max_restarts: int) -> List[str]:
    """The argv of ``muster run`` for run_cluster's arguments, checked."""
    if command is None:
        if not worker_script:
            raise MusterError("invalid_value", "give worker_script or command", "worker_script")
        # (relative to this process's directory, where muster run starts
        # the workers)
        command = [_own_kernel(), worker_script]
    if isinstance(command, str):
        raise MusterError("invalid_value", "command must be a list of strings", "command")
    if mode is None:
        mode = "ps" if n_ps else "allreduce"
    if mode not in ("ps", "allreduce", "exec"):
        raise MusterError("invalid_value", "mode must be ps, allreduce or exec", "mode")
    args = [find_cli(), "run", "--mode", mode, "--workers", str(int(n_workers)), "--cpu",
            str(cpu), "--memory", str(memory), "--gpu", str(int(nvidia_gpu)), "--port",
            str(int(port)), "--timeout", str(timeout_seconds)]
    if mode == "ps":
        args += ["--ps", str(int(n_ps))]
        if ps_cpu:
            args += ["--ps-cpu", str(ps_cpu)]
        if ps_memory:
            args += ["--ps-memory", str(ps_memory)]
    if max_restarts:
        args += ["--max-restarts", str(int(max_restarts))]
    if client.lease:
        # The run's workers are the session's: the client's lease covers
        # them (muster run must not give it back at its end).
        client._hold_lease()
        args += ["--no-lease"]
    return args + ["--"] + [str(a) for a in command]


class _Watch:
    """Finds the run that a muster run process recorded (by its lease
    holder, HOST-PID-RANDOM: this host, the process's PID) and shows its
    workers' progress, every half second until stopped."""

    def __init__(self, client: Any, proc: Any, size: int, progress: Progress):
        self.client, self.proc, self.size, self.progress = client, proc, size, progress
        self.run_id: Optional[str] = None
        self.found = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="muster-run-watch", daemon=True)
        self.thread.start()

    def find(self, timeout: Optional[float] = None) -> Optional[str]:
        """The run's id, looked up now if not known yet (None: not found);
        timeout: of the one call."""
        if self.run_id is None:
            query = [("session", self.client.session), ("status", "running"), ("limit", "500")]
            kw = {} if timeout is None else {"timeout": timeout}
            answer = self.client._request("GET", "/api/v1/runs", query=query, **kw)
            for r in answer.get("runs") or []:
                parts = str(r.get("holder") or "").rsplit("-", 2)
                if len(parts) == 3 and parts[0] == _HOST and parts[1] == str(self.proc.pid):
                    self.run_id = r.get("id")
                    self.found.set()
                    break
        return self.run_id

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                if self.find() and not self.progress.mode:
                    return
                if self.run_id:
                    answer = self.client._request("GET", "/api/v1/workers",
                                                  query=[("run", self.run_id), ("limit", "5000")])
                    # The newest attempt's workers (the list is newest first).
                    ws = [w for w in (answer.get("workers") or [])[:self.size]
                          if isinstance(w, dict)]
                    all_up = ws and all(w.get("status") not in ("scheduling", "starting")
                                        for w in ws)
                    if not self.stop.is_set():
                        self.progress.update(ws, "training" if all_up else "")
            except Exception:  # noqa: BLE001 (a thread's: the controller away for a
                pass           # moment, an odd answer; the next round tells)
            self.stop.wait(0.5)


def _holder_host() -> str:
    """This host's name as a lease holder spells it (libmuster's
    make_holder(): letters, digits and '-', at most 32)."""
    host = "".join(ch for ch in socket.gethostname()
                   if ch.isascii() and (ch.isalnum() or ch == "-"))
    return host[:32] or "host"


_HOST = _holder_host()


class _Reader:
    """Reads muster run's output from its start to its end, whatever the
    caller does meanwhile: each line into the run (its output, and what
    RunOutput takes from it) and, while someone waits in the foreground,
    to them (next_line()), else to output; at the end the process reaped,
    its pipe closed and the run's result in."""

    def __init__(self, run: Run, proc: Any, out: RunOutput, watch: Any,
                 output: Optional[Callable[[str], Any]]):
        self.run, self.proc, self.out, self.watch = run, proc, out, watch
        self.output = output        # called once nobody waits in the foreground
        # Under this lock: where a line goes, the switch to the background
        # and every call of output. No line is lost or sent out of order,
        # and one thread at a time calls output.
        self._cond = threading.Condition()
        self._foreground = True
        self._pending: "collections.deque[str]" = collections.deque()
        self._done = False
        run._output = collections.deque(maxlen=_KEEP_LINES)
        run._proc = proc
        run._reader = threading.Thread(target=self._main, name="muster-run-output", daemon=True)
        run._reader.start()

    def _emit(self, line: str) -> None:
        if self.output:
            try:
                self.output(line)
            except Exception:  # noqa: BLE001 (the caller's; the output is kept)
                self.output = None

    def _main(self) -> None:
        failed, code = None, None
        try:
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                self.run._output.append(line)
                self.out.feed(line)
                with self._cond:
                    if self._foreground:
                        self._pending.append(line)
                        self._cond.notify()
                    else:
                        self._emit(line)
        except BaseException as e:  # noqa: BLE001 (an unreadable pipe: the run is ended)
            failed = e
        finally:
            try:
                if failed is not None and self.proc.poll() is None:
                    try:
                        os.killpg(self.proc.pid, signal.SIGTERM)
                    except OSError:  # it ended meanwhile
                        pass
                code = self.proc.wait()
                self.proc.stdout.close()
            finally:
                if failed is not None and self.out.failure is None:
                    self.out.failure = "the output of muster run could not be read (%s)" % failed
                self.run.update({
                    "exit_code": code if failed is None and code is not None else (code or 1),
                    "summary": self.out.summary() if failed is None and code == 0 else None,
                    "run": self.out.run_id or self.run.get("run") or self.watch.run_id,
                    "restarts": self.out.restarts})
                with self._cond:
                    self._done = True
                    self._cond.notify_all()
                self.watch.stop.set()

    def next_line(self) -> Optional[str]:
        """The next line for the foreground, waiting for it; None at the end."""
        with self._cond:
            while not self._pending and not self._done:
                self._cond.wait()
            return self._pending.popleft() if self._pending else None

    def background(self, output_too: bool = True) -> None:
        """Nobody waits in the foreground any more: the lines not taken yet
        and every later one go to output (output_too=False: to run.output
        only)."""
        with self._cond:
            if not output_too:
                self.output = None
            self._foreground = False
            while self._pending:
                self._emit(self._pending.popleft())


def _abandon(run: Run, watch: _Watch, client: Any) -> None:
    """The caller's own code failed while the run went on: stop the run
    (its record ends as stopped, its workers stop) and muster run."""
    try:
        try:
            run["run"] = run.get("run") or watch.find(timeout=5)
            if run.id:
                run.stop()
            else:
                raise MusterError("not_found", "the run was not found")
        except Exception as e:  # noqa: BLE001 (the caller's error is the one to raise)
            sys.stderr.write("muster: run_cluster could not stop its run (%s); its workers stop "
                             "with this client (close(), or the interpreter's exit)\n" % e)
    finally:
        if run._proc.poll() is None:
            try:
                os.killpg(run._proc.pid, signal.SIGTERM)
            except OSError:
                pass


def _quietly(what: Callable[[], Any]) -> None:
    try:
        what()
    except Exception:  # noqa: BLE001 (a display that fails is no reason to fail)
        pass


def run_cluster(client: Any, n_workers: int, n_ps: int, args: List[str], mode: Optional[str],
                output: Optional[Callable[[str], Any]], progress: Optional[bool],
                wait: bool, find_timeout: float = 30.0) -> Run:
    """Runs ``muster run`` (args) and returns its Run: when it has ended,
    or with wait=False once the run is recorded (it goes on in the
    background; at most find_timeout s later without its id). A
    KeyboardInterrupt leaves the run going on; any other exception of the
    caller's (its output) stops it."""
    n_ps = int(n_ps) if (mode or ("ps" if n_ps else "allreduce")) == "ps" else 0
    env = dict(os.environ, MUSTER_URL=client.url, MUSTER_TOKEN=client.token or "",
               MUSTER_SESSION=client.session)
    size = int(n_workers) + n_ps
    run = Run(client, {"exit_code": None, "summary": None, "run": None, "restarts": 0},
              n_workers, n_ps)
    pm = Progress("run_cluster", size, progress if wait else False)
    out = RunOutput()
    # Its own session: a terminal's ^C reaches this process only, and the
    # run goes on (its workers end with this client's lease). The reader
    # starts at once, so that the pipe is drained whatever happens here.
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, encoding="utf-8", errors="replace",
                            bufsize=1, start_new_session=True)
    watch = reader = None
    show = output or print
    try:
        watch = _Watch(client, proc, size, pm)
        run._watch = watch
        reader = _Reader(run, proc, out, watch, output)
        client._keep(run)
        if not wait:
            reader.background()
            deadline = time.monotonic() + find_timeout
            while (not watch.found.wait(0.2) and run._reader.is_alive()
                   and time.monotonic() < deadline):
                pass
        else:
            while True:
                line = reader.next_line()
                if line is None:
                    break
                pm.line(line, show)
    except KeyboardInterrupt:
        if watch is None or reader is None:  # before the reader ran: nothing goes on
            _stop_early(proc, watch)
            raise
        watch.stop.set()
        reader.background()
        _quietly(lambda: watch.find(timeout=2))
        run["run"] = run.get("run") or watch.run_id
        _quietly(lambda: pm.close("interrupted"))
        if run.id:
            how = ("Get it back with run = muster.attach_run(%r) (run.wait(), run.logs(0)); "
                   "stop it with run.stop()" % run.id)
        else:
            how = "Stop it with stop_workers() (every worker of this session)"
        raise KeyboardInterrupt("run_cluster was interrupted; the run %sgoes on, and its workers "
                                "are left as they are. %s." % (
                                    run.id + " " if run.id else "", how)) from None
    except BaseException:
        if watch is None or reader is None:
            _stop_early(proc, watch)
            raise
        watch.stop.set()
        reader.background(output_too=False)  # the caller's output is what failed
        _quietly(lambda: pm.close("stopped"))
        _abandon(run, watch, client)
        raise
    if not wait:
        run["run"] = run.get("run") or watch.run_id
        code = run.get("exit_code")
        if code not in (None, 0) and out.error(code) is not None:
            raise out.error(code)  # muster run refused it before it ran
        if not run.id and run._reader.is_alive():
            sys.stderr.write("muster: run_cluster could not find its run's id within %g s; it "
                             "goes on (run.wait(), run.output)\n" % find_timeout)
        return run
    run._reader.join()
    watch.thread.join(1)
    code = run["exit_code"]
    _quietly(lambda: pm.close("succeeded" if code == 0 else "failed"))
    err = out.error(code)
    if err is not None:
        raise err
    if code != 0:
        e = MusterError("training_failed", out.failure or "muster run exited with code %s" % code)
        e.run = run
        raise e
    return run


def _stop_early(proc: Any, watch: Optional[_Watch]) -> None:
    """Setting up failed before the reader ran: muster run is ended and
    reaped (it has not run anything yet, or its workers end with it)."""
    if watch is not None:
        watch.stop.set()
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        pass
    proc.stdout.close()
    proc.wait()
