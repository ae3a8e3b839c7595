"""The local backend's worker processes, for the benches that start their own
controllers: they kill what those controllers started, and nothing else.

A local worker is known by its workerd's pid and start time (field 22 of
/proc/PID/stat): the controller writes backend_ref "PID:START" (see
controller/backend_local.c). A process whose start time differs has taken a
recycled pid and is never signalled.
"""
import os
import signal
import sqlite3
import subprocess

CGROUP_CLEAN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tests", "cgroup_clean.sh")


def proc_start(pid):
    """pid's start time (clock ticks since boot), or None when it is gone or a
    zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def parse_ref(ref):
    """(pid, start) from a local backend_ref "PID:START", or None."""
    try:
        pid, start = (ref or "").split(":")
        pid, start = int(pid), int(start)
    except ValueError:
        return None
    return (pid, start) if pid > 1 and start > 0 else None


def alive(proc):
    """Whether proc, a (pid, start), is still that process."""
    return proc is not None and proc_start(proc[0]) == proc[1]


def kill(proc):
    """SIGKILL proc's process group (its workerd leads its own session) and
    proc itself, if proc still is the process it was. True if signalled."""
    if not alive(proc):
        return False
    for target in (-proc[0], proc[0]):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
    return True


def from_state(state):
    """The (pid, start) of every worker the controller of state recorded."""
    path = os.path.join(state, "muster.db")
    if not os.path.exists(path):
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            refs = db.execute("SELECT backend_ref FROM workers WHERE backend = 'local' "
                              "AND backend_ref IS NOT NULL").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    return [p for p in (parse_ref(r) for (r,) in refs) if p]


def kill_all(state):
    """After the controller of state has ended: kills the workers it left
    running (best effort), then removes the cgroups it made for its workers
    (they outlive a controller by design; tests/cgroup_clean.sh). Returns how
    many workers were killed."""
    n = sum(kill(p) for p in from_state(state))
    subprocess.run(["bash", CGROUP_CLEAN, state])
    return n
