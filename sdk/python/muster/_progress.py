"""The progress of a wait: how many workers are scheduling, starting and
running, and why any still waits, updated in place (one display in a
notebook, one line on a terminal's stderr, nothing elsewhere)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Any, Dict, Iterable, Optional

from ._display import STATUS_COLOURS, counts, esc
from ._errors import _visible


def _notebook_display() -> Any:
    """IPython.display where this runs in a Jupyter kernel, else None."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too old or half imported: no notebook
        return None
    if shell is None or not hasattr(shell, "kernel"):
        return None  # the terminal IPython: its stderr is a terminal
    try:
        from IPython import display  # type: ignore[import-not-found]
    except ImportError:
        return None
    return display


def mode(progress: Optional[bool]) -> Optional[str]:
    """"notebook", "terminal" or None (no display): progress=None decides by
    where this runs (and MUSTER_PROGRESS=0 turns it off); False never shows,
    True shows even where stderr is no terminal (a line per change)."""
    if progress is False or (progress is None and os.environ.get("MUSTER_PROGRESS") == "0"):
        return None
    if _notebook_display() is not None:
        return "notebook"
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        return "terminal"
    return "lines" if progress else None


class Progress:
    """One display that update() redraws and close() leaves in its last
    state. Thread-safe: run_cluster's watcher updates it while the main
    thread prints the run's output through line()."""

    def __init__(self, title: str, total: int, progress: Optional[bool]):
        self.title = title
        self.total = total
        self.mode = mode(progress)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._handle: Any = None
        self._shown = ""      # the terminal line now on the screen
        self._last = ""       # the last text drawn, to skip redraws that change nothing
        self._drawn_at = 0.0
        self._text = ""
        self._html = ""
        self.counts = ""      # "1 scheduling, 2 running": the last update's
        self._closed = False  # close() has drawn the last state
        self._said = None     # the last line written in "lines" mode

    def update(self, workers: Iterable[Dict[str, Any]], note: str = "") -> None:
        """Counts workers by status; note: a word after the counts."""
        workers = [w for w in workers if isinstance(w, dict)]
        c = counts(workers)
        waits = [w for w in workers if w.get("status") == "scheduling" and w.get("waiting_for")]
        why = ""
        if waits:
            w = waits[0]
            why = "%s waits for %s" % (w.get("id"), w.get("waiting_for"))
            if len(waits) > 1:
                why += " (and %d more)" % (len(waits) - 1)
        counts_s = ", ".join("%d %s" % (n, s) for s, n in c.items()) or "no workers yet"
        self.counts = counts_s
        elapsed = time.monotonic() - self._t0
        of = "of %d worker%s" % (self.total, "" if self.total == 1 else "s")
        text = "%s: %s %s" % (self.title, counts_s, of)
        if why:
            text += "; " + why
        if note:
            text += "; " + note
        text += " (%.0f s)" % elapsed
        running = c.get("running", 0) + c.get("succeeded", 0)
        pct = 100.0 * running / self.total if self.total else 0.0
        bar = "".join('<span style="color:%s">&#9679; %d %s</span> ' % (
            STATUS_COLOURS.get(s, "#57606a"), n, esc(s)) for s, n in c.items())
        page = ('<div class="muster-progress" style="font-family:ui-monospace,monospace;'
                'font-size:12px"><b>%s</b> %s %s%s%s <span style="color:#57606a">'
                '(%.0f s)</span><div style="background:#eaeef2;height:4px;width:320px">'
                '<div style="background:#1a7f37;height:4px;width:%.0f%%"></div></div></div>' % (
                    esc(self.title), bar or "no workers yet ", of,
                    "; " + esc(why) if why else "", "; " + esc(note) if note else "",
                    elapsed, pct))
        with self._lock:
            if self._closed:
                return
            self._text, self._html = _visible(text), page
        self._draw()

    def _draw(self, final: bool = False) -> None:
        with self._lock:
            self._draw_locked(final)

    def _draw_locked(self, final: bool) -> None:
        """Draws the current state (under the lock). A display that fails
        is turned off: a display is never a reason for a wait to fail."""
        if self._closed or self.mode is None:
            return
        if final:
            self._closed = True
        key = self._text.rsplit(" (", 1)[0]
        now = time.monotonic()
        # A change redraws at once; the clock alone once a second.
        if not final and key == self._last and now - self._drawn_at < 1.0:
            return
        self._last, self._drawn_at = key, now
        try:
            if self.mode == "notebook":
                display = _notebook_display()
                if display is None:
                    return
                obj = display.HTML(self._html)
                if self._handle is None:
                    self._handle = display.display(obj, display_id=True)
                else:
                    self._handle.update(obj)
            elif self.mode == "terminal":
                line = self._text
                width = _width()
                if len(line) > width:
                    line = line[:width - 1] + "…"
                sys.stderr.write("\r\x1b[K" + line + ("\n" if final else ""))
                sys.stderr.flush()
                self._shown = "" if final else line
            elif self.mode == "lines" and (final or key != self._said):
                self._said = key
                sys.stderr.write(self._text + "\n")
                sys.stderr.flush()
        except Exception:  # noqa: BLE001 (a closed stderr, a display that fails)
            self.mode = None

    def line(self, text: str, write: Any) -> None:
        """Writes a line of output (write(text)) without tearing the
        terminal's progress line: it is cleared first and drawn again after."""
        if self.mode != "terminal":
            write(text)
            return
        with self._lock:
            shown = self._shown
            if shown:
                _quiet_write("\r\x1b[K")
            write(text)
            if shown and self._shown:
                _quiet_write(self._shown)

    def close(self, note: str = "") -> None:
        """Leaves the display in its last state (with note, if given) and,
        on a terminal, ends its line: all at once, no update in between."""
        with self._lock:
            if self._closed:
                return
            if not self._text:
                self._closed = True
                return
            if note:
                self._text = self._text.rsplit(" (", 1)[0] + "; " + _visible(note)
                self._html = self._html.replace("</b>", "</b> %s:" % esc(note), 1)
            self._draw_locked(final=True)


def _width() -> int:
    """The columns of the terminal stderr is (less one)."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    if columns <= 0:  # a terminal that does not say (a new pty)
        columns = shutil.get_terminal_size((100, 20)).columns
    return max(20, columns - 1)


def _quiet_write(s: str) -> None:
    try:
        sys.stderr.write(s)
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 (stderr closed: the output still goes out)
        pass
