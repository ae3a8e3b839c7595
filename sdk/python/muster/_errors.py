"""MusterError, and text from workers made safe to print."""

# The bidirectional controls, which reorder what follows them on screen.
# (and the line and paragraph separators, which break a line)
_BIDI = frozenset(list(range(0x202A, 0x202F)) + list(range(0x2066, 0x206A)) +
                  [0x200E, 0x200F, 0x061C, 0x2028, 0x2029])


def _visible(text, keep_lines=False):
    """text with its control characters written out (\\x1b, \\r; the C1
    controls as \\u0080...), newlines and tabs too unless keep_lines: what a
    worker or a launch set, shown so that it cannot drive a terminal."""
    if not isinstance(text, str):
        return text
    out = []
    for ch in text:
        n = ord(ch)
        if keep_lines and ch in "\n\t":
            out.append(ch)
        elif n < 0x20 or 0x7f <= n <= 0x9f or n in _BIDI:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(
                ch, "\\x%02x" % n if n < 0x80 else "\\u%04x" % n))
        else:
            out.append(ch)
    return "".join(out)


class MusterError(Exception):
    """An error from the muster controller, or on the way to it.

    Attributes:
        code: the REST error name, e.g. ``"invalid_value"``, ``"unauthorized"``,
            ``"not_found"``; ``"unreachable"`` when no controller answered,
            ``"timeout"`` when it did not answer in time, ``"protocol_error"``
            when its answer was not the JSON the API promises.
        message: the sentence saying what was wrong.
        field: the request field the error is about, or ``None``.
        status: the HTTP status of the answer, or ``None`` if there was none.
        run: for a failed :meth:`Client.run_cluster`, its :class:`Run` (to read
            each rank's output back); else ``None``.
    """

    def __init__(self, code, message, field=None, status=None):
        self.run = None
        self.code = code
        self.message = message
        self.field = field
        self.status = status
        super().__init__(self.__str__())

    def __str__(self):
        # A message may quote a worker's failure (its stderr's tail): its
        # control characters are written out, so that a traceback cannot
        # drive the reader's terminal; its lines stay lines.
        s = "%s: %s" % (self.code, _visible(self.message, keep_lines=True))
        if self.field:
            s += " (field: %s)" % _visible(self.field)
        return s

    def __repr__(self):
        return "MusterError(code=%r, message=%r, field=%r, status=%r)" % (
            self.code, self.message, self.field, self.status)

