/*
 * http_answer.c: reads an HTTP/1.1 answer out of the bytes http_client.c
 * received (struct hc's in buffer): its status line, the headers that frame
 * its body (Content-Length, Transfer-Encoding: chunked, Connection), and
 * the body itself, into h->answer. Interim answers (1xx) are skipped; a 100
 * Continue that a request is waiting for is reported.
 */
#include "http_client.h"

#include "muster_errors.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ANSWER_HEAD_MAX (64 * 1024) /* an answer's status line and headers */
#define CHUNK_LINE_MAX 1024         /* a chunk's size line, a trailer line */

enum { CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, CHUNK_TRAILER };

/* Drops the first n bytes of h->in. */
static void consume(struct hc *h, size_t n) {
  memmove(h->in, h->in + n, h->in_len - n);
  h->in_len -= n;
}

/* Moves *buf (its first len bytes; *cap allocated) to a new buffer of cap
 * bytes, wiping the old one before it is freed (an answer or a request may
 * hold a token). Returns 0 or -1 (out of memory: *buf as it was). */
int hc_grow_wiped(char **buf, size_t *cap, size_t len, size_t new_cap) {
  char *p = malloc(new_cap);

  if (!p)
    return -1;
  if (*buf) {
    memcpy(p, *buf, len);
    explicit_bzero(*buf, *cap);
    free(*buf);
  }
  *buf = p;
  *cap = new_cap;
  return 0;
}

/* Appends n bytes to the answer. Returns 0, MUSTER_E_TOO_LARGE or
 * MUSTER_E_NOMEM (h->err says so). */
static int append(struct hc *h, const char *p, size_t n) {
  if (n > h->answer_max - h->answer_len) {
    snprintf(h->err, sizeof(h->err), "the answer is larger than %zu bytes", h->answer_max);
    return MUSTER_E_TOO_LARGE;
  }
  if (h->answer_len + n + 1 > h->answer_cap) {
    size_t cap = h->answer_cap ? h->answer_cap : 1024;

    while (cap < h->answer_len + n + 1)
      cap *= 2;
    if (hc_grow_wiped(&h->answer, &h->answer_cap, h->answer_len, cap) != 0) {
      snprintf(h->err, sizeof(h->err), "out of memory");
      return MUSTER_E_NOMEM;
    }
  }
  memcpy(h->answer + h->answer_len, p, n);
  h->answer_len += n;
  h->answer[h->answer_len] = '\0';
  return 0;
}

/* Says the answer is malformed. Returns MUSTER_E_UNREACHABLE. */
static int bad(struct hc *h, const char *what) {
  snprintf(h->err, sizeof(h->err), "the controller's answer is not HTTP/1.1 (%s)", what);
  return MUSTER_E_UNREACHABLE;
}

/* Whether the comma-separated header value v (len bytes) lists token. */
static bool lists(const char *v, size_t len, const char *token) {
  size_t tn = strlen(token);

  for (size_t i = 0; i + tn <= len; i++)
    if (strncasecmp(v + i, token, tn) == 0 && (i == 0 || v[i - 1] == ' ' || v[i - 1] == ',') &&
        (i + tn == len || v[i + tn] == ' ' || v[i + tn] == ',' || v[i + tn] == ';'))
      return true;
  return false;
}

/* Parses a complete head (len bytes, ending in CRLF CRLF) at h->in. Returns
 * 0 or MUSTER_E_UNREACHABLE. */
static int parse_head(struct hc *h, size_t len) {
  const char *p = h->in, *end = h->in + len;
  bool length_known = false, http11;
  unsigned long long length = 0;
  int minor, st;

  /* (h->in is not NUL-terminated: the digits are read by hand) */
  if (len < 12 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ' ||
      p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9' ||
      (len > 12 && p[12] != ' ' && p[12] != '\r'))
    return bad(h, "its status line");
  st = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
  minor = p[7] - '0';
  http11 = minor == 1;
  h->status = st;
  h->chunked = h->until_eof = false;
  h->keep = http11;
  p = memchr(p, '\n', (size_t)(end - p)) + 1;
  while (p < end - 2) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *colon = memchr(p, ':', (size_t)(eol - p));
    const char *v;
    size_t vn;

    if (!colon)
      return bad(h, "a header line");
    v = colon + 1;
    while (v < eol && (*v == ' ' || *v == '\t'))
      v++;
    vn = (size_t)(eol - v);
    while (vn && (v[vn - 1] == '\r' || v[vn - 1] == ' ' || v[vn - 1] == '\t'))
      vn--;
    if ((size_t)(colon - p) == 14 && strncasecmp(p, "Content-Length", 14) == 0) {
      char num[24];
      char *stop;

      if (!vn || vn >= sizeof(num) || strspn(v, "0123456789") < vn)
        return bad(h, "its Content-Length");
      memcpy(num, v, vn);
      num[vn] = '\0';
      length = strtoull(num, &stop, 10);
      length_known = true;
    } else if ((size_t)(colon - p) == 17 && strncasecmp(p, "Transfer-Encoding", 17) == 0) {
      h->chunked = lists(v, vn, "chunked");
    } else if ((size_t)(colon - p) == 10 && strncasecmp(p, "Connection", 10) == 0) {
      if (lists(v, vn, "close"))
        h->keep = false;
    }
    p = eol + 1;
  }
  if (st < 200 || st == 204 || st == 304) {
    h->chunked = false; /* (never a body, whatever the headers say) */
    h->left = 0;
  } else if (h->chunked) {
    h->chunk_phase = CHUNK_SIZE;
  } else if (length_known) {
    h->left = length;
  } else {
    h->until_eof = true;
    h->keep = false;
  }
  return 0;
}

/* Takes the chunked body's bytes from h->in. Returns 0 (more to come), 1
 * (the body is complete), or an error. */
static int take_chunked(struct hc *h) {
  for (;;) {
    char *eol;
    size_t n;
    int rc;

    switch (h->chunk_phase) {
    case CHUNK_SIZE:
    case CHUNK_TRAILER:
      eol = h->in_len ? memchr(h->in, '\n', h->in_len) : NULL;
      if (!eol)
        return h->in_len > CHUNK_LINE_MAX ? bad(h, "a chunk's size line") : 0;
      n = (size_t)(eol - h->in) + 1;
      if (h->chunk_phase == CHUNK_TRAILER) {
        bool empty = n <= 2;

        h->head_bytes += n;
        if (h->head_bytes > ANSWER_HEAD_MAX)
          return bad(h, "its trailer is too long");
        consume(h, n);
        if (empty)
          return 1;
        continue;
      }
      {
        char line[CHUNK_LINE_MAX + 1], *stop;
        unsigned long long size;

        if (n > CHUNK_LINE_MAX || !isxdigit((unsigned char)h->in[0]))
          return bad(h, "a chunk's size line");
        memcpy(line, h->in, n);
        line[n] = '\0';
        size = strtoull(line, &stop, 16);
        if (stop == line || (*stop != '\r' && *stop != '\n' && *stop != ';' && *stop != ' '))
          return bad(h, "a chunk's size line");
        consume(h, n);
        if (size == 0) {
          h->chunk_phase = CHUNK_TRAILER;
        } else {
          h->left = size;
          h->chunk_phase = CHUNK_DATA;
        }
      }
      continue;
    case CHUNK_DATA:
      n = h->in_len < h->left ? h->in_len : (size_t)h->left;
      if (!n)
        return 0;
      if ((rc = append(h, h->in, n)) != 0)
        return rc;
      consume(h, n);
      h->left -= n;
      if (!h->left)
        h->chunk_phase = CHUNK_CRLF;
      continue;
    default: /* CHUNK_CRLF */
      if (h->in_len < 2)
        return 0;
      if (h->in[0] != '\r' || h->in[1] != '\n')
        return bad(h, "a chunk's end");
      consume(h, 2);
      h->chunk_phase = CHUNK_SIZE;
      continue;
    }
  }
}

/* Parses what h->in holds. Returns 0 (more is needed), 1 (the answer is
 * complete: h->status, h->answer; h->keep says whether the connection may
 * serve another request), 2 (a 100 Continue the request waits for), or
 * MUSTER_E_UNREACHABLE (malformed) / MUSTER_E_TOO_LARGE / MUSTER_E_NOMEM,
 * with h->err saying why. */
int hc_answer_take(struct hc *h) {
  while (!h->head_done) {
    char *end = h->in_len >= 4 ? memmem(h->in, h->in_len, "\r\n\r\n", 4) : NULL;
    size_t len;
    int rc;

    if (!end)
      return h->in_len > ANSWER_HEAD_MAX ? bad(h, "its head is too long") : 0;
    len = (size_t)(end - h->in) + 4;
    h->head_bytes += len; /* (1xx answers count too: they cannot go on for ever) */
    if (h->head_bytes > ANSWER_HEAD_MAX)
      return bad(h, "its heads are too long");
    if ((rc = parse_head(h, len)) != 0)
      return rc;
    consume(h, len);
    if (h->status >= 200) {
      h->head_done = true;
    } else if (h->status == 100 && h->expect && !h->continued) {
      return 2;
    }
  }
  if (h->until_eof) {
    int rc = h->in_len ? append(h, h->in, h->in_len) : 0;

    h->in_len = 0;
    return rc;
  }
  if (h->chunked)
    return take_chunked(h);
  {
    size_t n = h->in_len < h->left ? h->in_len : (size_t)h->left;
    int rc = n ? append(h, h->in, n) : 0;

    if (rc)
      return rc;
    consume(h, n);
    h->left -= n;
    return h->left ? 0 : 1;
  }
}

/* The connection ended: returns whether that completes the answer (one
 * whose length is the connection's). */
int hc_answer_at_end(struct hc *h) {
  return h->head_done && h->until_eof;
}
