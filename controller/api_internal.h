/*
 * api_internal.h: what the parts of the REST API share.
 *
 *   api_http.c    libmicrohttpd plumbing: answers, authentication, the route
 *                 table, the request life cycle, read-only connections
 *   api_client.c  the client endpoints (launch, list, get, stop, await,
 *                 sessions, health, metrics, the web UI's files)
 *   api_worker.c  the calls of a worker's own muster-workerd
 *   api_stream.c  the event stream and logs (followed or not)
 *   api_runs.c    sessions' leases, the session list, and runs
 *
 * Every handler has the route_fn shape; arg is the path's {id} or {name}
 * (already checked to be a worker id where the route names one), or the
 * path itself for the web UI. Handlers run on libmicrohttpd's threads
 * without the state lock; they take it (state_lock()) only around what
 * touches the state machine, and read through api_reader_get() otherwise.
 */
#ifndef MUSTER_API_INTERNAL_H
#define MUSTER_API_INTERNAL_H

#include "api.h"
#include "db.h"
#include "util.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>

/* Per-request state, kept in libmicrohttpd's con_cls. */
struct req {
  char *body; /* the request body, at most 1 MiB (NUL-terminated) */
  size_t len;
  int too_large;
  struct waiter *waiter; /* a suspended await */
};

typedef enum MHD_Result (*route_fn)(struct MHD_Connection *c, struct req *rq, const char *arg);

/* Who may call a route. */
enum route_auth {
  AUTH_NONE,   /* anyone: health, metrics, the web UI's files */
  AUTH_CLIENT, /* the API token (the event stream also takes ?access_token=) */
  AUTH_WORKER, /* that worker's own token, checked by the handler */
};

struct api_route {
  const char *method;
  const char
      *path; /* "/api/v1/workers/{id}/logs": {id} is a worker id, {name} or {run} any segment */
  enum route_auth auth;
  route_fn fn;
};

/* The route table (for docs and their test); *n gets its length. */
const struct api_route *api_routes(int *n);

/* ---- read-only database connections (api_http.c) ---- */

struct reader {
  pthread_mutex_t mu;
  struct db *db;
};

/* Takes a read-only connection, waiting if all are busy; give it back with
 * api_reader_put(). Never held across a wait. */
struct reader *api_reader_get(void);
void api_reader_put(struct reader *r);

/* The worker object of id as JSON text, from the cache (wcache.h) or read
 * through rd. Returns a malloc'ed string (length *len; caller frees), or
 * NULL if there is no such worker. */
char *api_worker_text(struct reader *rd, const char *id, size_t *len);

/* The worker object of id: a new reference, or NULL if there is none. */
json_t *api_worker_read(const char *id);

/* ---- answers (api_http.c) ---- */

/* Queues body (a reference is stolen) as a JSON answer with status. */
MUST_CHECK enum MHD_Result api_respond_json(struct MHD_Connection *c, unsigned status,
                                            json_t *body);
/* Queues the error object for err with a sentence from fmt (NULL: err's
 * own message) and field, if any. */
MUST_CHECK enum MHD_Result api_respond_error(struct MHD_Connection *c, int err, const char *field,
                                             const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
MUST_CHECK enum MHD_Result api_respond_empty(struct MHD_Connection *c, unsigned status);
/* Queues text (malloc'ed; taken over, freed by libmicrohttpd) as JSON. */
MUST_CHECK enum MHD_Result api_respond_text(struct MHD_Connection *c, unsigned status, char *text,
                                            size_t len);

/* The bearer token of the request (borrowed), or NULL. */
const char *api_bearer(struct MHD_Connection *c);

/* The body as a JSON object: a new reference, or NULL with a 400 queued
 * through *ret. */
json_t *api_parse_body(struct MHD_Connection *c, struct req *rq, enum MHD_Result *ret);

/* Reads the paging parameters limit (default 500, at most 5000) and before
 * (a cursor from an earlier page's "next"). Returns 0, or queues a 422
 * naming the parameter through *ret (api_client.c). */
MUST_CHECK int api_page_params(struct MHD_Connection *c, int *limit, int64_t *before,
                               enum MHD_Result *ret);

/* ---- await (api_client.c) ---- */

/* Answers a resumed await and frees its waiter. */
MUST_CHECK enum MHD_Result api_await_finish(struct MHD_Connection *c, struct req *rq);
void api_waiter_free(struct waiter *wt);

/* ---- logs (api_worker.c) ---- */

/* The file of worker id's stream ("stdout" when NULL, or "stderr").
 * Returns 0, or MUSTER_E_INVALID for another stream name. */
int api_log_path(const char *id, const char *stream, char *buf, size_t size)
    __attribute__((warn_unused_result));

/* ---- the handlers ---- */

MUST_CHECK enum MHD_Result api_launch(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_list(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_get(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_delete(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_stop_workers(struct MHD_Connection *c, struct req *rq,
                                            const char *arg);
MUST_CHECK enum MHD_Result api_await(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_session(struct MHD_Connection *c, struct req *rq, const char *name);
MUST_CHECK enum MHD_Result api_sessions(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_lease_put(struct MHD_Connection *c, struct req *rq,
                                         const char *name);
MUST_CHECK enum MHD_Result api_lease_delete(struct MHD_Connection *c, struct req *rq,
                                            const char *name);
MUST_CHECK enum MHD_Result api_run_create(struct MHD_Connection *c, struct req *rq,
                                          const char *arg);
MUST_CHECK enum MHD_Result api_runs_list(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_run_get(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_run_restart(struct MHD_Connection *c, struct req *rq,
                                           const char *id);
MUST_CHECK enum MHD_Result api_run_end(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_health(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_metrics(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_static(struct MHD_Connection *c, struct req *rq, const char *url);
MUST_CHECK enum MHD_Result api_register(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_heartbeat(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_exit(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_log_append(struct MHD_Connection *c, struct req *rq, const char *id);
MUST_CHECK enum MHD_Result api_events(struct MHD_Connection *c, struct req *rq, const char *arg);
MUST_CHECK enum MHD_Result api_logs(struct MHD_Connection *c, struct req *rq, const char *id);

#endif
