/* api_reply.c: what the router and the handlers of the REST API both use:
 * answers, the bearer token, request bodies and paging parameters. It
 * calls neither. See api_internal.h. */
#include "api_internal.h"

#include "muster_errors.h"
#include "util.h"
#include "validate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- answers ---- */

/* Queues body (a reference is stolen) as a JSON answer with status. */
enum MHD_Result api_respond_json(struct MHD_Connection *c, unsigned status, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT);

  json_decref(body);
  if (!text)
    return MHD_NO;
  return api_respond_text(c, status, text, strlen(text));
}

enum MHD_Result api_respond_error(struct MHD_Connection *c, int err, const char *field,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Queues the error object (docs/design.md) for err, with a sentence from fmt. */
enum MHD_Result api_respond_error(struct MHD_Connection *c, int err, const char *field,
                                  const char *fmt, ...) {
  char msg[1024];
  json_t *e;
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(msg, sizeof(msg), fmt ? fmt : muster_strerror(err), ap);
  va_end(ap);
  /* A long message is cut at a character's first byte, not inside one. */
  if (n >= (int)sizeof(msg)) {
    size_t end = sizeof(msg) - 1, lead = end - 1, need;
    unsigned char b;
    while (lead > 0 && ((unsigned char)msg[lead] & 0xC0) == 0x80)
      lead--;
    b = (unsigned char)msg[lead];
    need = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    if (lead + need > end)
      msg[lead] = '\0';
  }
  e = json_pack("{s:s, s:s}", "code", muster_error_name(err), "message", msg);
  /* Jansson takes no invalid UTF-8: the error still has a body then,
   * with the code's own sentence, rather than a dropped connection. */
  if (!e)
    e = json_pack("{s:s, s:s}", "code", muster_error_name(err), "message", muster_strerror(err));
  if (!e)
    return MHD_NO;
  if (field)
    json_object_set_new(e, "field", json_string(field));
  return api_respond_json(c, (unsigned)muster_error_http_status(err),
                          json_pack("{s:o}", "error", e));
}

enum MHD_Result api_respond_empty(struct MHD_Connection *c, unsigned status) {
  struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, status, r);

  MHD_destroy_response(r);
  return ret;
}

/* Queues text (malloc'ed, taken over) as a JSON answer. */
enum MHD_Result api_respond_text(struct MHD_Connection *c, unsigned status, char *text,
                                 size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  enum MHD_Result ret;

  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- authentication ---- */

const char *api_bearer(struct MHD_Connection *c) {
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");

  if (!h || strncasecmp(h, "Bearer ", 7) != 0)
    return NULL;
  h += 7;
  while (*h == ' ')
    h++;
  return h;
}

/* Parses the request body as a JSON object; NULL (with an error queued
 * through *ret) if it is not one. New reference. */
json_t *api_parse_body(struct MHD_Connection *c, struct req *rq, enum MHD_Result *ret) {
  json_error_t jerr;
  json_t *body;

  if (rq->len == 0) {
    *ret = api_respond_error(c, MUSTER_E_MALFORMED, NULL, "the request needs a JSON body");
    return NULL;
  }
  body = json_loadb(rq->body, rq->len, JSON_REJECT_DUPLICATES, &jerr);
  if (!body) {
    *ret = api_respond_error(c, MUSTER_E_MALFORMED, NULL,
                             "the body is not valid JSON: %s (line %d)", jerr.text, jerr.line);
    return NULL;
  }
  if (!json_is_object(body)) {
    json_decref(body);
    *ret = api_respond_error(c, MUSTER_E_MALFORMED, NULL, "the body must be a JSON object");
    return NULL;
  }
  return body;
}

/* See api_internal.h. */
int api_known_fields(struct MHD_Connection *c, json_t *body, const char *const *known, size_t n,
                     const char *list, enum MHD_Result *ret) {
  const char *key = validate_unknown_field(body, known, n);

  if (key)
    *ret = api_respond_error(c, MUSTER_E_INVALID, "body", "unknown field \"%.64s\" (known: %s)",
                             key, list);
  return key == NULL;
}

/* See api_internal.h. */
int api_page_params(struct MHD_Connection *c, int *limit, int64_t *before, enum MHD_Result *ret) {
  const char *l = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
  const char *b = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
  long v;

  *limit = 500;
  *before = 0;
  if (l) {
    if (util_parse_long(l, 1, 5000, &v) != 0) {
      *ret = api_respond_error(c, MUSTER_E_INVALID, "limit", "limit must be 1 to 5000");
      return -1;
    }
    *limit = (int)v;
  }
  if (b && *b) {
    if (util_parse_long(b, 1, 0x7fffffffffffffffL, &v) != 0) {
      *ret = api_respond_error(c, MUSTER_E_INVALID, "before",
                               "before must be the \"next\" cursor of an earlier page");
      return -1;
    }
    *before = v;
  }
  return 0;
}
