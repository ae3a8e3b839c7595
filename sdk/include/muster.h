/*
 * muster.h: the muster client library (libmuster).
 *
 * A client talks to one muster controller over its REST API (DESIGN.md).
 * Every call that can fail returns 0 or a negative muster_error (see
 * muster_errors.h); muster_client_errmsg() then holds the controller's
 * sentence (or the transport's), and muster_client_errfield() the field it
 * named. The library never prints and never exits.
 *
 * A client is not thread-safe; use one per thread.
 *
 *   muster_client *c;
 *   muster_worker_list ws;
 *   muster_launch_opts o;
 *   muster_launch_opts_init(&o);
 *   o.n = 2;
 *   o.code = "print('hi')";
 *   if (muster_client_new_default(&c) == 0 && muster_launch(c, &o, &ws) == 0) ...
 */
#ifndef MUSTER_H
#define MUSTER_H

#include "muster_errors.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUSTER_WARN_UNUSED __attribute__((warn_unused_result))

typedef struct muster_client muster_client;

typedef enum muster_status {
  MUSTER_SCHEDULING,
  MUSTER_STARTING,
  MUSTER_RUNNING,
  MUSTER_SUCCEEDED,
  MUSTER_FAILED,
  MUSTER_STOPPED,
  MUSTER_STATUS_UNKNOWN
} muster_status;

/* "scheduling", ... ("unknown" for MUSTER_STATUS_UNKNOWN). */
const char *muster_status_name(muster_status s);
/* 1 for succeeded, failed and stopped. */
int muster_status_terminal(muster_status s);

/* A worker as the controller describes it. Strings are NULL where the
 * controller says null; the whole struct is owned by the list (or by
 * muster_worker_cleanup() for a single one). */
typedef struct muster_worker {
  char id[16];
  muster_status status;
  char *session, *name, *role;
  double cpu, memory;
  int nvidia_gpu;
  char *script, *code, *kernel;
  char *ip_address, *hostname;
  int exec_port;  /* 0 if unknown */
  char *backend, *backend_ref;
  int has_exit_code;
  int exit_code;
  int signal;     /* 0 if none */
  char *failure;  /* the sentence saying why it failed, or NULL */
  char *created_at, *running_at, *finished_at, *last_heartbeat;
  char *json; /* the whole worker object as the controller sent it */
} muster_worker;

typedef struct muster_worker_list {
  size_t count;
  muster_worker *items;
} muster_worker_list;

void muster_worker_cleanup(muster_worker *w);
/* Frees the items of l and empties it; NULL is a no-op. */
void muster_worker_list_free(muster_worker_list *l);

/* Creates a client for the controller at url (e.g. "http://127.0.0.1:8470")
 * with the API token. *out must be freed with muster_client_free(). */
int muster_client_new(const char *url, const char *token, muster_client **out) MUSTER_WARN_UNUSED;

/* Creates a client from the environment: MUSTER_URL and MUSTER_TOKEN, or
 * else the files url and token of the local controller's state directory
 * ($MUSTER_STATE_DIR, default ~/.muster). MUSTER_E_UNREACHABLE if neither
 * says where a controller is (muster_strerror() explains; no client is
 * made, so there is no errmsg to read). */
int muster_client_new_default(muster_client **out) MUSTER_WARN_UNUSED;

/* Frees the client; NULL is a no-op. */
void muster_client_free(muster_client *c);

/* The URL the client talks to (borrowed). */
const char *muster_client_url(const muster_client *c);

/* The sentence of the last failed call: the controller's message, or what
 * went wrong on the way (borrowed; "" after a success). */
const char *muster_client_errmsg(const muster_client *c);
/* The field the controller named in the last error, or NULL. */
const char *muster_client_errfield(const muster_client *c);

/* How long one call may take, apart from await (which adds its own
 * timeout) and followed logs / events (none). Default 30 s. */
void muster_client_set_timeout(muster_client *c, double seconds);

/* What to launch. muster_launch_opts_init() sets DESIGN.md's defaults
 * (n 1, cpu 1, memory 1, no GPU, kernel python3, session "default"). The
 * pointers are borrowed for the call. */
typedef struct muster_launch_opts {
  int n;
  double cpu, memory;
  int nvidia_gpu;
  const char *script, *code, *kernel;
  const char *const *command; /* argv, ncommand entries */
  size_t ncommand;
  const char *const *args;    /* arguments of script/code/command */
  size_t nargs;
  const char *const *env;     /* "NAME=value" strings */
  size_t nenv;
  const char *const *secret_env; /* "NAME=value"; never shown back */
  size_t nsecret_env;
  const char *role, *name, *session;
} muster_launch_opts;

void muster_launch_opts_init(muster_launch_opts *o);

/* Launches o->n workers; *out gets them (free with
 * muster_worker_list_free()). */
int muster_launch(muster_client *c, const muster_launch_opts *o,
                  muster_worker_list *out) MUSTER_WARN_UNUSED;

/* The worker id; *out is cleaned up with muster_worker_cleanup(). */
int muster_get(muster_client *c, const char *id, muster_worker *out) MUSTER_WARN_UNUSED;

/* Workers, newest first, filtered: statuses is a mask of
 * (1 << muster_status) bits (0: any); session and role NULL for any.
 * *last_event (if not NULL) gets the event seq of the moment of the list,
 * from which muster_events() continues without a gap. */
int muster_list(muster_client *c, unsigned statuses, const char *session, const char *role,
                muster_worker_list *out, int64_t *last_event) MUSTER_WARN_UNUSED;

typedef struct muster_await_result {
  muster_worker_list workers;  /* reached the target (running / succeeded) */
  muster_worker_list failures; /* everything else */
  int timed_out;
} muster_await_result;

void muster_await_result_free(muster_await_result *r);

/* Waits until every worker of ids is running (wait_for_completion 0) or
 * terminal (1), or timeout_seconds pass (0: no timeout). */
int muster_await(muster_client *c, const char *const *ids, size_t nids, int wait_for_completion,
                 double timeout_seconds, muster_await_result *out) MUSTER_WARN_UNUSED;

/* Stops the workers ids; with nids 0, every live worker of session (NULL:
 * "default"). *out (may be NULL) gets them as they are now. */
int muster_stop(muster_client *c, const char *const *ids, size_t nids, const char *session,
                muster_worker_list *out) MUSTER_WARN_UNUSED;

typedef enum muster_stream { MUSTER_STDOUT, MUSTER_STDERR } muster_stream;

/* Called with each piece of output; returning non-zero ends the call
 * early (with 0). */
typedef int (*muster_data_cb)(void *arg, const char *data, size_t len);

/* Reads worker id's output from byte offset; with follow, keeps reading
 * until the worker has ended. */
int muster_logs(muster_client *c, const char *id, muster_stream stream, int64_t offset,
                int follow, muster_data_cb cb, void *arg) MUSTER_WARN_UNUSED;

typedef struct muster_event {
  int64_t seq;
  char worker_id[16];
  muster_status from; /* MUSTER_STATUS_UNKNOWN for a worker's creation */
  muster_status to;
  const char *at;     /* borrowed for the callback */
  const char *detail; /* borrowed for the callback; may be NULL */
} muster_event;

/* Called with each state change; returning non-zero ends the call (with 0). */
typedef int (*muster_event_cb)(void *arg, const muster_event *e);

/* Follows the state changes after seq since, as they happen, until cb
 * returns non-zero, the controller ends the stream, or muster_client_cancel()
 * is called from another thread. */
int muster_events(muster_client *c, int64_t since, muster_event_cb cb,
                  void *arg) MUSTER_WARN_UNUSED;

/* Makes a call running in another thread on c (a followed muster_logs(),
 * muster_events(), an await) return at once with MUSTER_E_SHUTTING_DOWN,
 * and every later call on c too: a cancelled client is only good for
 * muster_client_free(). The only call that may be made on a client from
 * another thread. */
void muster_client_cancel(muster_client *c);

#ifdef __cplusplus
}
#endif
#endif
