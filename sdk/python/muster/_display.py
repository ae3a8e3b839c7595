"""How workers, a wait's answer, a run and a client look: an HTML table in
Jupyter (``_repr_html_``), aligned text everywhere else (``repr``).

The values stay what the REST API answers: a :class:`WorkerList` is a list
of plain worker dicts, an :class:`AwaitResult` the dict CML code indexes
(``done["workers"]``); only how they print changes."""

from __future__ import annotations

import html
import urllib.parse
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ._errors import _visible

# A status's colour in a notebook (the web UI's).
STATUS_COLOURS = {
    "scheduling": "#8a6d00",
    "starting": "#1f5fbf",
    "running": "#1a7f37",
    "succeeded": "#116329",
    "failed": "#cf222e",
    "stopped": "#57606a",
}
LIVE = ("scheduling", "starting", "running")

_TABLE_STYLE = ("border-collapse:collapse;font-family:ui-monospace,monospace;"
                "font-size:12px;text-align:left")
_CELL_STYLE = "padding:2px 8px;border-bottom:1px solid #d0d7de;vertical-align:top;text-align:left"


def _number(v: Any) -> str:
    """v without a trailing .0: 2 for 2.0, 0.25 as it is (nan, inf too)."""
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


def esc(s: Any, keep_lines: bool = False) -> str:
    """s for HTML: its control characters written out (its newlines and
    tabs kept with keep_lines), then escaped."""
    return html.escape(_visible(str(s), keep_lines))


def resources(w: Dict[str, Any]) -> str:
    """"0.5 CPU, 1 GiB" (and the GPUs, if any) of a worker."""
    s = "%s CPU, %s GiB" % (_number(w.get("cpu", "?")), _number(w.get("memory", "?")))
    if w.get("nvidia_gpu"):
        s += ", %s GPU" % _number(w["nvidia_gpu"])
    return s


def usage(w: Dict[str, Any]) -> str:
    """"1.2 s CPU, 35 MiB" from the worker's last usage sample, or ""."""
    u = w.get("usage")
    if not isinstance(u, dict):
        return ""
    parts = []
    if isinstance(u.get("cpu_seconds"), (int, float)):
        parts.append("%.1f s CPU" % u["cpu_seconds"])
    if isinstance(u.get("memory_bytes"), (int, float)):
        parts.append("%.0f MiB" % (u["memory_bytes"] / 1048576.0))
    return ", ".join(parts)


def why(w: Dict[str, Any]) -> str:
    """The sentence that explains a worker: its failure, what it waits for,
    or how it ended."""
    if w.get("failure"):
        return str(w["failure"])
    if w.get("status") == "scheduling" and w.get("waiting_for"):
        return "waits for " + str(w["waiting_for"])
    if w.get("status") == "succeeded" and w.get("exit_code") is not None:
        return "exit code %s" % w["exit_code"]
    return ""


def _short(s: str, width: int) -> str:
    return s if len(s) <= width else s[:width - 1] + "…"


_COLUMNS = ("id", "status", "ip", "role", "resources", "usage", "why")
_HEADINGS = {"id": "ID", "status": "STATUS", "ip": "IP", "role": "ROLE",
             "resources": "RESOURCES", "usage": "USAGE", "why": "FAILURE / WAITS FOR"}


def _row(w: Any) -> Dict[str, str]:
    if not isinstance(w, dict):  # not a worker: shown as what it is
        w = {"id": repr(w)}
    return {"id": str(w.get("id", "?")), "status": str(w.get("status", "?")),
            "ip": str(w.get("ip_address") or "-"), "role": str(w.get("role") or "-"),
            "resources": resources(w), "usage": usage(w), "why": why(w)}


def _shown(rows: Sequence[Dict[str, str]]) -> List[str]:
    """The columns to show: the id, the status, and each other one that
    some row has a value in."""
    return [c for c in _COLUMNS
            if c in ("id", "status") or any(r[c] not in ("", "-") for r in rows)]


def text_table(workers: Sequence[Dict[str, Any]]) -> str:
    """The workers as aligned columns, a heading first; their text with its
    control characters written out."""
    if not workers:
        return "(no workers)"
    rows = [_row(w) for w in workers]
    # A failure's lines (a stderr's tail) on one line, " | " between them.
    rows = [{k: _visible(v.replace("\n", " | ") if k == "why" else v) for k, v in r.items()}
            for r in rows]
    rows = [dict(r, why=_short(r["why"], 120)) for r in rows]
    cols = _shown(rows)
    width = {c: max(len(_HEADINGS[c]), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(_HEADINGS[c].ljust(width[c]) for c in cols).rstrip()]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols).rstrip() for r in rows]
    return "\n".join(lines)


def status_html(status: str, label: Optional[str] = None) -> str:
    """status (or label) with a dot, in the status's colour."""
    colour = STATUS_COLOURS.get(status, "#57606a")
    return ('<span style="color:%s;font-weight:600">&#9679; %s</span>'
            % (colour, esc(status if label is None else label)))


def _link(base: Optional[str], fragment: str, text: str) -> str:
    if not base:
        return esc(text)
    return ('<a href="%s/#/%s" target="_blank" title="open in the muster web UI">%s</a>'
            % (html.escape(base, quote=True), html.escape(urllib.parse.quote(fragment, safe="/"),
                                                          quote=True), esc(text)))


def html_table(workers: Sequence[Dict[str, Any]], base: Optional[str]) -> str:
    """The workers as an HTML table: each id a link to the worker's page in
    the web UI at base (the controller's URL), its status in its colour."""
    if not workers:
        return "<p><i>no workers</i></p>"
    rows = [_row(w) for w in workers]
    cols = _shown(rows)
    head = "".join('<th style="%s">%s</th>' % (_CELL_STYLE, _HEADINGS[c]) for c in cols)
    body = []
    for r in rows:
        wid = r["id"]
        cells = {"id": _link(base, "workers/" + wid, wid), "status": status_html(r["status"]),
                 "why": esc(r["why"], keep_lines=True)}
        body.append("<tr class=\"muster-worker muster-%s\">%s</tr>" % (
            html.escape(r["status"], quote=True),
            "".join('<td style="%s;white-space:%s">%s</td>' % (
                _CELL_STYLE, "pre-wrap" if c == "why" else "nowrap",
                cells.get(c, esc(r[c]))) for c in cols)))
    return ('<table class="muster-workers" style="%s"><thead><tr>%s</tr></thead>'
            "<tbody>%s</tbody></table>" % (_TABLE_STYLE, head, "".join(body)))


def counts(workers: Iterable[Dict[str, Any]]) -> Dict[str, int]:
    """How many workers are in each status, in the order of a worker's life."""
    out: Dict[str, int] = {}
    for w in workers:
        s = str(w.get("status", "?")) if isinstance(w, dict) else "?"
        out[s] = out.get(s, 0) + 1
    order = list(STATUS_COLOURS)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99))


def counts_text(c: Dict[str, int]) -> str:
    return ", ".join("%d %s" % (n, s) for s, n in c.items()) or "no workers"


class WorkerList(list):
    """A list of worker dicts (as the REST API describes them), shown as a
    table: HTML in a notebook, aligned text elsewhere."""

    def __init__(self, workers: Iterable[Dict[str, Any]] = (), base: Optional[str] = None):
        super().__init__(workers)  # the dicts as they are
        self._base = base

    def ids(self) -> List[str]:
        """The workers' ids, in order."""
        return [w["id"] for w in self]

    def __repr__(self) -> str:
        return text_table(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        return html_table(self, self._base)


class Worker(dict):
    """One worker dict, shown as a one-row table."""

    def __init__(self, values: Dict[str, Any], base: Optional[str] = None):
        super().__init__(values)
        self._base = base

    def __repr__(self) -> str:
        return text_table([self])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        return html_table([self], self._base)


class AwaitResult(dict):
    """What await_workers returns: ``{"workers", "failures", "timed_out",
    "waiting_for"}``, shown as one table of every worker with a line that
    counts them."""

    def _all(self) -> List[Dict[str, Any]]:
        return list(self.get("workers", [])) + list(self.get("failures", []))

    def _headline(self) -> str:
        s = "%d reached the target, %d did not" % (len(self.get("workers", [])),
                                                   len(self.get("failures", [])))
        s += " (%s)" % counts_text(counts(self._all()))
        if self.get("timed_out"):
            s += "; the wait timed out"
        return s

    def __repr__(self) -> str:
        return self._headline() + "\n" + text_table(self._all())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        base = getattr(self.get("workers"), "_base", None)
        return "<p>%s</p>%s" % (esc(self._headline()), html_table(self._all(), base))


def fields_html(rows: Sequence[Sequence[str]], title: str) -> str:
    """A two-column table of (name, HTML value) rows under a title."""
    cell = '<td style="%s">%%s</td>' % _CELL_STYLE
    body = "".join("<tr><th style=\"%s\">%s</th>%s</tr>" % (_CELL_STYLE, esc(k), cell % v)
                   for k, v in rows)
    return ('<table class="muster-fields" style="%s"><caption style="text-align:left;'
            'font-weight:600">%s</caption>%s</table>' % (_TABLE_STYLE, title, body))


def fields_text(rows: Sequence[Sequence[str]], title: str) -> str:
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([title] + ["  %s  %s" % (k.ljust(width), _visible(v)) for k, v in rows])
