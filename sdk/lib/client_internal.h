/* client_internal.h: what the client's files (client.c, http.c, workers.c,
 * calls.c, events.c) share: the handle's fields, the HTTP call, the worker
 * objects made from JSON. Not part of libmuster's API. */
#ifndef MUSTER_SDK_CLIENT_INTERNAL_H
#define MUSTER_SDK_CLIENT_INTERNAL_H

#include "internal.h"
#include "muster.h"
#include "util.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

struct muster_client {
  CURL *curl;
  char *url;
  char auth[256];
  double timeout_s;
  char errmsg[1024];
  char errfield[64];
  int has_errfield;
  int cancel;       /* sticky: once set, every call returns at once */
  long last_status; /* the HTTP status of the last answer (0: none) */
  /* The socket of the transfer in progress, so that a cancel from another
   * thread can wake it at once (libcurl looks at its progress callback only
   * about once a second on an idle stream). */
  pthread_mutex_t sock_lock;
  curl_socket_t sock;
};

struct buf {
  char *data;
  size_t len;
  int too_big;
};

/* One call: method path (with query), body (JSON text or NULL). On success
 * (2xx) *answer (if not NULL) gets the parsed JSON (new reference; NULL for
 * an empty body) and *hdr_seq the X-Muster-Last-Event header if asked.
 * timeout_s 0 means none. write/wdata replace the collecting of the body
 * (streaming). */
struct call {
  const char *method, *path, *body;
  double timeout_s;
  json_t **answer;
  int64_t *hdr_seq;
};

/* ---- client.c: the handle and its error ---- */

/* Records the message of a failed call in c and returns err. */
MUSTER_INTERNAL int muster_set_errorf_(muster_client *c, int err, const char *field,
                                       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Forgets c's last error (the start of every call). */
MUSTER_INTERNAL void muster_clear_error_(muster_client *c);
/* 1 once muster_client_cancel() was called on c (from any thread). */
MUSTER_INTERNAL int muster_client_cancelled_(muster_client *c);

/* ---- http.c: the transport ---- */

/* Runs call k on c. Returns 0 or an error, recorded in c. */
MUSTER_INTERNAL MUST_CHECK int muster_http_(muster_client *c, const struct call *k);
/* Runs a JSON call whose body is req (stolen), with the transport timeout
 * timeout_s (0: none); *answer as in struct call. Returns 0 or an error,
 * recorded in c. */
MUSTER_INTERNAL MUST_CHECK int muster_json_call_timeout_(muster_client *c, const char *method,
                                                         const char *path, json_t *req,
                                                         double timeout_s, json_t **answer);
/* Like muster_http_() for a GET whose answer is streamed to write. Returns 0
 * also when the writer ended the transfer on purpose (*stopped set);
 * silence_s > 0 ends a stream quiet for that long. */
MUSTER_INTERNAL MUST_CHECK int muster_http_stream_(muster_client *c, const char *path,
                                                   curl_write_callback write, void *wdata,
                                                   const int *stopped, long silence_s);

/* ---- workers.c: worker objects ---- */

/* The status called name (MUSTER_STATUS_UNKNOWN for NULL or another). */
MUSTER_INTERNAL muster_status muster_status_parse_(const char *name);
/* Fills *w from the worker object o (borrowed reference); w's strings are
 * freed with muster_worker_cleanup(). */
MUSTER_INTERNAL void muster_worker_from_json_(json_t *o, muster_worker *w);
/* Fills *out from the JSON array arr (borrowed reference), to be freed with
 * muster_worker_list_free(). Returns 0 or an error, recorded in c. */
MUSTER_INTERNAL int muster_list_from_json_(muster_client *c, json_t *arr, muster_worker_list *out);
/* 0 if id looks like a worker id, else MUSTER_E_INVALID, recorded in c. */
MUSTER_INTERNAL int muster_worker_id_ok_(muster_client *c, const char *id);

#endif
