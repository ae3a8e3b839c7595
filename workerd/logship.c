/*
 * logship.c: shipping the worker's stdout and stderr to the controller.
 *
 * Each stream (struct stream, in wd.out and wd.err) is a ring buffer of up to
 * 8 MiB of bytes the controller has not taken yet. The main loop reads the
 * command's pipes into it (stream_read()), the exec channel copies its
 * commands' output into it (stream_append()), and it is flushed once it
 * holds 64 KiB or 200 ms after its oldest byte (streams_flush_due()), or at
 * once before an exec command's end is told (streams_flush_now()), in POSTs
 * of at most 512 KiB. While the controller is away the bytes stay; a full
 * ring drops its oldest and says so in the log once it gets through.
 */
#include "workerd.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Output streams                                                           */

/* Gives where the next bytes of s may be written and how many fit there
 * contiguously. When the ring is full it first drops the oldest 64 KiB
 * (counted for the notice), so a flood while the controller is away costs
 * one step per 64 KiB rather than one per read. */
static void stream_space(struct stream *s, char **where, size_t *room) {
  size_t tail;

  if (s->len == WD_STREAM_CAP) {
    s->start = (s->start + WD_FLUSH_BYTES) % WD_STREAM_CAP;
    s->len -= WD_FLUSH_BYTES;
    s->dropped += WD_FLUSH_BYTES;
  }
  if (s->len == 0)
    s->start = 0;
  tail = (s->start + s->len) % WD_STREAM_CAP;
  *where = s->ring + tail;
  *room = tail >= s->start ? WD_STREAM_CAP - tail : s->start - tail;
}

/* Counts n bytes just written at the place stream_space() gave. */
static void stream_commit(struct stream *s, size_t n, int64_t now) {
  if (s->len == 0)
    s->first_ms = now;
  s->len += n;
}

/* Drops the n oldest bytes of s, which the controller has taken. */
static void stream_consume(struct stream *s, size_t n) {
  s->start = (s->start + n) % WD_STREAM_CAP;
  s->len -= n;
  if (s->len == 0)
    s->start = 0;
}

/* Gives s its ring (WD_STREAM_CAP bytes, freed by cleanup()) if it has none
 * yet: the worker's command has one from its start, an idle worker's once an
 * exec command first writes. Returns 0, or MUSTER_E_NOMEM. */
MUST_CHECK int stream_open(struct stream *s) {
  if (!s->ring)
    s->ring = malloc(WD_STREAM_CAP);
  return s->ring ? 0 : MUSTER_E_NOMEM;
}

/* Appends n bytes that did not come through s's pipe (workerd's own words,
 * an exec command's output) to s, whose ring must be open. Never blocks: a
 * full ring drops its oldest bytes, as for the pipe's. */
void stream_append(struct stream *s, const char *data, size_t n, int64_t now) {
  while (n > 0) {
    char *where;
    size_t room;

    stream_space(s, &where, &room);
    if (room > n)
      room = n;
    memcpy(where, data, room);
    stream_commit(s, room, now);
    data += room;
    n -= room;
  }
}

/* Reads what the pipe of s holds now (bounded per call, so that one chatty
 * stream cannot starve the loop), and closes it at end of file. */
void stream_read(struct stream *s, int64_t now) {
  for (int i = 0; i < WD_READS_PER_WAKE && s->fd >= 0; i++) {
    char *where;
    size_t room;
    ssize_t n;

    stream_space(s, &where, &room);
    if (room > WD_FLUSH_BYTES)
      room = WD_FLUSH_BYTES;
    n = read(s->fd, where, room);
    if (n > 0) {
      stream_commit(s, (size_t)n, now);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n < 0)
      LOG(LOG_WARN, "reading the command's %s: %s", s->name, strerror(errno));
    close(s->fd);
    s->fd = -1;
  }
}

/* Sends n bytes to the controller's log of the stream named suffix. Returns 0
 * when the controller took them, or refused them for good (a 4xx: logged; the
 * caller drops them, since sending them again can never succeed), and
 * MUSTER_E_UNREACHABLE when they must be kept for the next flush. */
MUST_CHECK static int log_post(const char *suffix, const char *bytes, size_t n) {
  long status;
  int rc = http_post(suffix, false, bytes, n, &status);

  if (rc || status >= 500)
    return MUSTER_E_UNREACHABLE;
  if (status < 200 || status >= 300)
    LOG(LOG_WARN, "the controller refused %zu bytes of %s (HTTP %ld); dropping them", n, suffix,
        status);
  return 0;
}

/* Sends everything s holds, in POSTs of at most 512 KiB, preceded by a notice
 * if bytes were dropped. Returns 0 once s is empty, or MUSTER_E_UNREACHABLE
 * with the unsent bytes still in s. */
MUST_CHECK static int stream_flush(struct stream *s) {
  char suffix[32];
  char notice[128];
  int rc = 0;

  snprintf(suffix, sizeof(suffix), "logs?stream=%s", s->name);
  while (s->len > 0) {
    size_t n = s->len;

    /* Tests: what a stopping worker ships (its last words) reaches the
     * controller well after the stop was recorded there. */
    if (wd.stopping)
      FAULT_POINT("workerd_ship_after_stop");
    if (s->dropped) {
      int k = snprintf(notice, sizeof(notice),
                       "[muster-workerd: %" PRIu64
                       " bytes of output dropped while the controller was unreachable]\n",
                       s->dropped);
      rc = log_post(suffix, notice, (size_t)k);
      if (rc)
        goto out;
      s->dropped = 0;
    }
    if (n > WD_STREAM_CAP - s->start)
      n = WD_STREAM_CAP - s->start;
    if (n > WD_POST_MAX)
      n = WD_POST_MAX;
    rc = log_post(suffix, s->ring + s->start, n);
    if (rc)
      goto out;
    stream_consume(s, n);
  }
out:
  return rc;
}

/* When s must next be flushed: INT64_MAX if it is empty; otherwise at 64 KiB
 * or 200 ms after its oldest byte, but not before the retry time that a
 * failed flush set. */
int64_t stream_deadline(const struct stream *s) {
  int64_t due;

  if (s->len == 0)
    return INT64_MAX;
  due = s->len >= WD_FLUSH_BYTES ? 0 : s->first_ms + WD_FLUSH_DELAY_MS;
  return due > wd.logs_retry_at_ms ? due : wd.logs_retry_at_ms;
}

/* Flushes the streams that hold bytes: those whose deadline has come, or
 * all of them if now_too. Never before the retry time a failure set; a
 * failure postpones every stream's flush by the next backoff delay, so that a
 * missing controller costs one attempt per delay, not one per loop round. */
static void streams_flush(int64_t now, bool now_too) {
  struct stream *all[2] = {&wd.out, &wd.err};

  for (int i = 0; i < 2; i++) {
    if (all[i]->len == 0 || now < wd.logs_retry_at_ms ||
        (!now_too && now < stream_deadline(all[i])))
      continue;
    if (stream_flush(all[i]) == 0) {
      wd.logs_backoff_ms = WD_RETRY_FIRST_MS;
      continue;
    }
    wd.logs_retry_at_ms = util_mono_ms() + wd.logs_backoff_ms;
    wd.logs_backoff_ms =
        wd.logs_backoff_ms * 2 > WD_RETRY_MAX_MS ? WD_RETRY_MAX_MS : wd.logs_backoff_ms * 2;
    break;
  }
}

/* Flushes the streams whose deadline has come. */
void streams_flush_due(int64_t now) {
  streams_flush(now, false);
}

/* Flushes every stream that holds bytes now, unless a failed flush's retry
 * time is still ahead or the controller was not reached last time (or the
 * worker is ending): one try, which blocks the loop as a due flush does.
 * The exec channel calls it before it tells a client that its command
 * ended, so that what the command wrote is in the worker's log by then. */
void streams_flush_now(int64_t now) {
  /* Only while the last call reached the controller: one that is away or
   * hangs must not hold up the exec channel's answer (the bytes ship on the
   * loop's own schedule then). */
  if (wd.controller_up && !wd.ending)
    streams_flush(now, true);
}

/* Flushes both streams now. Returns 0 or MUSTER_E_UNREACHABLE. */
MUST_CHECK int streams_flush_all(void) {
  int rc = wd.out.ring ? stream_flush(&wd.out) : 0;

  if (rc == 0 && wd.err.ring)
    rc = stream_flush(&wd.err);
  return rc;
}
