/*
 * api_internal.h: what the parts of the REST API share.
 *
 *   api_http.c      libmicrohttpd plumbing: the request life cycle,
 *                   authentication of client calls, the router that walks
 *                   the route tables
 *   api_routes.c    the list of the route tables
 *   api_reply.c     answers, the bearer token, request bodies, paging
 *                   parameters: what handlers and router both use
 *   api_readers.c   the pool of read-only database connections, worker
 *                   objects read through it
 *   api_launch.c    POST /api/v1/workers
 *   api_list.c      GET /api/v1/workers (pages), GET /api/v1/workers/{id}
 *   api_stop.c      POST /api/v1/workers/stop, DELETE /api/v1/workers/{id}
 *   api_await.c     POST /api/v1/workers/await (a parked connection)
 *   api_health.c    GET /api/v1/health, GET /metrics
 *   api_web.c       the web UI's files (the router's fallback outside /api/)
 *   api_worker.c    the calls of a worker's own muster-workerd
 *   api_claim.c     a queueing backend's job claiming its workers' tokens
 *   api_stream.c    the event stream and logs (followed or not)
 *   api_sessions.c  sessions' leases, the session list, one session
 *   api_runs.c      runs
 *   api_metrics.c   runs' metrics
 *
 * Each handler file registers its handlers in a route table of its own
 * (api_*_routes, listed by api_routes.c); the router (api_http.c) only
 * walks the tables, and no handler calls the router. Every handler has the
 * route_fn shape; arg is the path's {id} or {name} (already checked to be
 * a worker id where the route names one), or the path itself for the web
 * UI. Handlers run on libmicrohttpd's threads without the state lock; they
 * take it (state_lock()) only around what touches the state machine, and
 * read through api_reader_get() otherwise.
 */
#ifndef MUSTER_API_INTERNAL_H
#define MUSTER_API_INTERNAL_H

#include "api.h"
#include "db.h"
#include "util.h"

#include "session_name.h"
#include "users.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>

struct req;

/* What a request parked by its handler (MHD_suspend_connection) does when
 * libmicrohttpd calls again after it was resumed, and when its connection
 * ends before that: the handler sets them, the router only calls them. */
typedef enum MHD_Result (*req_resume_fn)(struct MHD_Connection *c, struct req *rq);
typedef void (*req_release_fn)(struct req *rq);

/* Per-request state, kept in libmicrohttpd's con_cls. */
struct req {
  char *body; /* the request body, at most max_body bytes (NUL-terminated) */
  size_t len;
  size_t max_body;
  int too_large;
  /* What answers, picked from the request's head before any body byte is
   * read (api_http.c): a route and its {id} or {name}, or the web UI. */
  const struct api_route *route;
  char arg[SESSION_STORED_MAX];
  int web;
  struct user_id who;    /* whose token a client call carries */
  int run_token;         /* AUTH_RUN: the call carries the run's own token */
  struct waiter *waiter; /* a suspended await */
  req_resume_fn resume;  /* set while parked */
  req_release_fn release;
};

typedef enum MHD_Result (*route_fn)(struct MHD_Connection *c, struct req *rq, const char *arg);

/* Who may call a route. */
enum route_auth {
  AUTH_NONE,   /* anyone: health, metrics, the web UI's files */
  AUTH_CLIENT, /* the API token (the event stream also takes ?access_token=) */
  AUTH_WORKER, /* that worker's own token (the route's check, then the handler) */
  AUTH_SECRET, /* a job's secret, checked by the handler (body: API_SECRET_BODY) */
  AUTH_RUN,    /* the run's own token (the route's check), else as AUTH_CLIENT */
};

/* A worker route's (or a run route's) check of the token, from the
 * request's head: 0, or the error to answer (MUSTER_E_UNAUTHORIZED,
 * MUSTER_E_FORBIDDEN). */
typedef int (*route_check_fn)(struct MHD_Connection *c, const char *id);

/* One route. Its method is POST, PUT, GET or DELETE. A table of them ends
 * with an entry whose method is NULL. */
struct api_route {
  const char *method;
  const char
      *path; /* "/api/v1/workers/{id}/logs": {id} is a worker id, {name} or {run} any segment */
  enum route_auth auth;
  route_fn fn;
  route_check_fn check; /* AUTH_WORKER, AUTH_RUN: required */
};

/* The largest body a call takes, and a job's claim (whose secret is checked
 * only with the body): a job's worker list. */
#define API_MAX_BODY (1024 * 1024)
#define API_SECRET_BODY (64 * 1024)

/* ---- the route tables (each in its handler file) ---- */

extern const struct api_route api_health_routes[];   /* api_health.c */
extern const struct api_route api_worker_routes[];   /* api_worker.c */
extern const struct api_route api_claim_routes[];    /* api_claim.c */
extern const struct api_route api_launch_routes[];   /* api_launch.c */
extern const struct api_route api_list_routes[];     /* api_list.c */
extern const struct api_route api_await_routes[];    /* api_await.c */
extern const struct api_route api_stop_routes[];     /* api_stop.c */
extern const struct api_route api_stream_routes[];   /* api_stream.c */
extern const struct api_route api_sessions_routes[]; /* api_sessions.c */
extern const struct api_route api_runs_routes[];     /* api_runs.c */
extern const struct api_route api_users_routes[];    /* api_users.c */
extern const struct api_route api_metrics_routes[];  /* api_metrics.c */

/* Every table above, NULL-terminated (api_routes.c). No two routes match
 * one method and URL, so their order does not matter. */
extern const struct api_route *const api_route_tables[];

/* What answers a GET of a path outside /api/ (arg: the path): the web UI's
 * files (api_web.c). */
extern const route_fn api_web_fallback;

/* ---- read-only database connections (api_readers.c) ---- */

struct reader {
  pthread_mutex_t mu;
  struct db *db;
};

/* Opens the pool: --http-threads + 2 read-only connections to the state
 * directory's database (at most 66). Returns 0 or an error with a sentence
 * in err; api_readers_close() closes what was opened either way. */
MUST_CHECK int api_readers_open(char *err, size_t errlen);
void api_readers_close(void);

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

/* ---- answers and requests (api_reply.c) ---- */

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

/* 1 if every key of body is one of known (n of them); else queues a 422
 * naming the first other one (and list, the known ones) through *ret. */
int api_known_fields(struct MHD_Connection *c, json_t *body, const char *const *known, size_t n,
                     const char *list, enum MHD_Result *ret);

/* Reads the paging parameters limit (default 500, at most 5000) and before
 * (a cursor from an earlier page's "next"). Returns 0, or queues a 422
 * naming the parameter through *ret. */
MUST_CHECK int api_page_params(struct MHD_Connection *c, int *limit, int64_t *before,
                               enum MHD_Result *ret);

/* ---- streaming answers (api_stream.c) ---- */

struct stream;
/* Answers with r, the callback answer of stream s (r's free callback
 * frees s): lists s, so that wakes reach it, and queues r as type; one that
 * cannot be listed is answered with the error instead (r destroyed). */
MUST_CHECK enum MHD_Result api_queue_stream(struct MHD_Connection *c, struct stream *s,
                                            struct MHD_Response *r, const char *type);

/* ---- logs (api_worker.c) ---- */

/* The file of worker id's stream ("stdout" when NULL, or "stderr").
 * Returns 0, or MUSTER_E_INVALID for another stream name. */
int api_log_path(const char *id, const char *stream, char *buf, size_t size)
    __attribute__((warn_unused_result));

/* The file whose presence says that worker id's workerd has shipped all its
 * output (it reported its exit, which it does only after its last flush). */
void api_log_end_path(const char *id, char *buf, size_t size);

#endif
