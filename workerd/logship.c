/*
 * logship.c: shipping the worker's stdout and stderr to the controller.
 *
 * Each stream (struct stream, in wd.out and wd.err) is a ring buffer of up to
 * 8 MiB of bytes the controller has not taken yet. The main loop reads the
 * command's pipes into it (stream_read()), the exec channel copies its
 * commands' output into it (stream_append()), and it is shipped once it
 * holds 64 KiB or 200 ms after its oldest byte, or at once while an exec
 * command's end waits for its output to be in the log (streams_ship_soon()),
 * in POSTs of at most 512 KiB, one in flight per stream (ctl_call.c), so a
 * stream's bytes arrive in order, each naming where its first byte is in
 * the stream (pos: the controller leaves out what a POST of the same bytes
 * delivered, one whose answer came too late). Nothing waits on a POST: the pipes are
 * read while it flies, into the ring behind the bytes it carries (a copy).
 * While the controller is away the bytes stay; a full ring drops its oldest
 * and says how many in a notice line, sent before the bytes that follow the
 * gap.
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

/* Exec commands' ends wait until each stream's settled count reaches this
 * (streams_ship_soon()): until then it ships without the usual wait. */
static uint64_t soon[2];

/* ------------------------------------------------------------------------ */
/* Output streams                                                           */

/* Gives where the next bytes of s may be written and how many fit there
 * contiguously. When the ring is full it first drops the oldest 64 KiB
 * (counted for the notice), so a flood while the controller is away costs
 * one step per 64 KiB rather than one per read. */
static void stream_space(struct stream *s, char **where, size_t *room) {
  size_t tail;

  if (s->len == WD_STREAM_CAP) {
    /* Bytes a POST in flight carries are not lost with the ring's copy:
     * they are counted when the POST ends, as taken or as dropped. */
    size_t carried = s->inflight < WD_FLUSH_BYTES ? s->inflight : WD_FLUSH_BYTES;

    s->start = (s->start + WD_FLUSH_BYTES) % WD_STREAM_CAP;
    s->len -= WD_FLUSH_BYTES;
    s->inflight -= carried;
    s->dropped += WD_FLUSH_BYTES - carried;
    s->settled += WD_FLUSH_BYTES - carried;
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
  s->appended += n;
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

/* Whether s has something to ship. */
static bool stream_pending(const struct stream *s) {
  return s->ring && (s->len > 0 || s->dropped > 0);
}

/* When s must next be shipped: INT64_MAX if it holds nothing or its POST is
 * in flight; otherwise at 64 KiB, or 200 ms after its oldest byte, or at
 * once while an exec X waits for it; but not before the retry time that a
 * failed POST set. */
static int64_t stream_due(const struct stream *s) {
  bool urgent = s->settled < soon[s == &wd.out ? 0 : 1];
  int64_t due;

  if (!stream_pending(s) || s->call.state != CALL_IDLE)
    return INT64_MAX;
  due = urgent || s->len >= WD_FLUSH_BYTES || s->len == 0 ? 0 : s->first_ms + WD_FLUSH_DELAY_MS;
  return due > wd.logs_retry_at_ms ? due : wd.logs_retry_at_ms;
}

/* When the main loop must next call streams_ship(). */
int64_t streams_deadline(void) {
  int64_t a = stream_due(&wd.out), b = stream_due(&wd.err);

  return a < b ? a : b;
}

/* A POST that started at started_ms got no usable answer (or could not
 * start): postpones every stream's next POST by the backoff delay, so that a
 * missing controller costs one try per delay, not one per loop round. */
static void ship_failed(int64_t started_ms, int64_t now) {
  if (started_ms > wd.logs_failed_ms)
    wd.logs_failed_ms = started_ms;
  wd.logs_retry_at_ms = now + wd.logs_backoff_ms;
  wd.logs_backoff_ms =
      wd.logs_backoff_ms * 2 > WD_RETRY_MAX_MS ? WD_RETRY_MAX_MS : wd.logs_backoff_ms * 2;
}

/* Starts s's next POST: the notice of dropped bytes first if there are any,
 * else a copy of the ring's oldest bytes (at most 512 KiB, up to the ring's
 * end). */
static void stream_ship(struct stream *s, int64_t now) {
  char suffix[64];
  int rc;

  /* Tests: what a stopping worker ships (its last words) reaches the
   * controller well after the stop was recorded there. */
  if (wd.stopping)
    FAULT_POINT("workerd_ship_after_stop");
  snprintf(suffix, sizeof(suffix), "logs?stream=%s", s->name);
  if (s->dropped) {
    int k = snprintf(s->notice, sizeof(s->notice),
                     "[muster-workerd: %" PRIu64
                     " bytes of output dropped while the controller was unreachable]\n",
                     s->dropped);

    s->notice_n = s->dropped;
    /* (where the gap ends: a notice sent again, its answer lost, is left
     * out) */
    snprintf(suffix, sizeof(suffix), "logs?stream=%s&gap=%" PRIu64, s->name, s->appended - s->len);
    rc = call_start(&s->call, suffix, false, s->notice, (size_t)k, WD_CALL_TIMEOUT_MS);
  } else {
    size_t n = s->len;

    if (!s->send && !(s->send = malloc(WD_POST_MAX))) {
      ship_failed(now, now);
      return;
    }
    if (n > WD_STREAM_CAP - s->start)
      n = WD_STREAM_CAP - s->start;
    if (n > WD_POST_MAX)
      n = WD_POST_MAX;
    memcpy(s->send, s->ring + s->start, n);
    s->sent = s->inflight = n;
    s->post_appended = s->appended;
    /* (where its first byte is in the stream: the controller leaves out
     * what a POST of the same bytes delivered, one whose answer was lost) */
    snprintf(suffix, sizeof(suffix), "logs?stream=%s&pos=%" PRIu64, s->name, s->appended - s->len);
    rc = call_start(&s->call, suffix, false, s->send, n, WD_CALL_TIMEOUT_MS);
  }
  if (rc) {
    s->notice_n = 0;
    s->sent = s->inflight = 0;
    ship_failed(now, now);
  }
}

/* Starts a POST for each stream that is due (or holds anything, if all) and
 * has none in flight, unless a failure's retry time is still ahead. */
void streams_ship(int64_t now, bool all) {
  struct stream *both[2] = {&wd.out, &wd.err};

  for (int i = 0; i < 2; i++) {
    struct stream *s = both[i];

    if (!stream_pending(s) || s->call.state != CALL_IDLE || now < wd.logs_retry_at_ms)
      continue;
    if (all || now >= stream_due(s))
      stream_ship(s, now);
  }
}

/* Takes the POST of s that ended, if one did: what the controller took, or
 * refused for good (a 4xx: logged, dropped, since sending it again can never
 * succeed), leaves the ring; after no answer or a 5xx the bytes stay for the
 * next try, but those a full ring dropped meanwhile are counted dropped. */
static void stream_take(struct stream *s, int64_t now) {
  long status;
  int rc;

  if (s->call.state != CALL_DONE)
    return;
  rc = call_take(&s->call, &status);
  if (rc || status >= 500) {
    s->dropped += s->sent - s->inflight;
    s->settled += s->sent - s->inflight;
    s->notice_n = 0;
    s->sent = s->inflight = 0;
    ship_failed(s->call.started_ms, now);
    return;
  }
  if (status < 200 || status >= 300)
    LOG(LOG_WARN, "the controller refused %zu bytes of %s (HTTP %ld); dropping them",
        s->notice_n ? strlen(s->notice) : s->sent, s->name, status);
  if (s->notice_n) {
    s->dropped -= s->notice_n;
    s->notice_n = 0;
  } else {
    stream_consume(s, s->inflight);
    s->settled += s->sent;
    s->sent = s->inflight = 0;
    /* What came in while the POST flew waits its own 200 ms (or 64 KiB),
     * so that a steady flow ships in batches, not one POST per answer;
     * bytes held from before it (past the ring's end) are due already. */
    if (s->len <= s->appended - s->post_appended)
      s->first_ms = now;
  }
  wd.logs_backoff_ms = WD_RETRY_FIRST_MS;
}

/* Takes each stream's POST that ended. */
void streams_take(int64_t now) {
  stream_take(&wd.out, now);
  stream_take(&wd.err, now);
}

/* True when both streams are shipped: nothing held, nothing in flight. */
bool streams_idle(void) {
  return !stream_pending(&wd.out) && !stream_pending(&wd.err) && wd.out.call.state == CALL_IDLE &&
         wd.err.call.state == CALL_IDLE;
}

/* Abandons the POSTs in flight and what is still held: the worker ends
 * without them. */
void streams_cancel(void) {
  struct stream *both[2] = {&wd.out, &wd.err};

  for (int i = 0; i < 2; i++) {
    call_cancel(&both[i]->call);
    /* Settled, as never to be shipped: what the ring holds (the bytes in
     * flight included) and what it dropped from under the POST. */
    both[i]->settled += both[i]->len + (both[i]->sent - both[i]->inflight);
    both[i]->start = both[i]->len = both[i]->sent = both[i]->inflight = 0;
    both[i]->dropped = both[i]->notice_n = 0;
  }
}

/* Notes how many bytes each stream has been given so far, for
 * streams_shipped(). */
void streams_mark(uint64_t mark[2]) {
  mark[0] = wd.out.appended;
  mark[1] = wd.err.appended;
}

/* True once every byte given before mark was taken by the controller (or
 * refused, or dropped): it is in the worker's log, or never will be. */
bool streams_shipped(const uint64_t mark[2]) {
  return wd.out.settled >= mark[0] && wd.err.settled >= mark[1];
}

/* Ships what the streams hold without the usual 200 ms wait, until every
 * byte given before mark is settled: an exec command's end waits for its
 * output to be in the log. */
void streams_ship_soon(const uint64_t mark[2]) {
  for (int i = 0; i < 2; i++)
    if (mark[i] > soon[i])
      soon[i] = mark[i];
}
