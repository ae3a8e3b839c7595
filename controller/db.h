/*
 * db.h: the controller's SQLite store.
 *
 * One writing connection, used only under the state lock (see state.h), and
 * read-only connections (db_open_reader()) that the API uses without it,
 * each by one thread at a time. SQL lives
 * in migrations/ and in the prepared statements of db.c; no SQL is ever
 * built from user data.
 */
#ifndef MUSTER_DB_H
#define MUSTER_DB_H

#include "session_name.h"
#include "util.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>

struct db;

/* One migration compiled into the binary (generated from migrations/). */
struct db_migration {
  const char *name;
  const char *sql;
};
extern const struct db_migration db_migrations[];
extern const int db_migration_count;

/* A new worker row, as validated by the API. Strings are borrowed. */
struct db_worker_new {
  const char *id, *session, *name, *role;
  double cpu, memory;
  int nvidia_gpu;
  const char *script, *code, *kernel;
  const char *command_json, *args_json, *env_json, *secret_env_json;
  const char *token, *master_ip, *backend, *launch_id;
  const char *run;   /* the run it belongs to, or NULL */
  const char *cwd;   /* where it starts (absolute), or NULL: the controller's --workdir */
  const char *path;  /* the PATH its commands are looked up on, or NULL: the worker's own */
  const char *owner; /* the user who launched it, or NULL: the bootstrap administrator */
};

/* Fields that a transition may set; NULL / -1 leaves a column as it is. */
struct db_fields {
  const char *ip_address, *hostname, *backend_ref, *failure, *bind_ip, *gpu_indices;
  int exec_port, pid, exit_code, signal; /* -1: leave */
  int set_running_at, set_finished_at, set_heartbeat;
  int attempt; /* -1: leave; set: backend_ref becomes backend_ref (NULL clears it) */
};
#define DB_FIELDS_INIT                                                                             \
  { NULL, NULL, NULL, NULL, NULL, NULL, -1, -1, -1, -1, 0, 0, 0, -1 }

/* Opens (creating if needed) the database at path in WAL mode and applies
 * every pending migration in one transaction. A database whose
 * user_version is newer than this binary's migrations is refused with
 * MUSTER_E_SCHEMA_TOO_NEW and a message in errbuf. On success *out is a new
 * handle to be freed with db_close(). */
__attribute__((warn_unused_result)) int db_open(const char *path, struct db **out, char *errbuf,
                                                size_t errlen);

/* Opens a read-only connection to the database that db_open() set up, for
 * lists and gets that must not wait for the writer (WAL readers see the
 * last commit). Same ownership as db_open(). */
__attribute__((warn_unused_result)) int db_open_reader(const char *path, struct db **out,
                                                       char *errbuf, size_t errlen);

/* Sets how many pages of write-ahead log make the writer copy it into the
 * database at a commit (SQLite's default: 1,000); the checkpointer thread
 * (checkpoint.c) does it sooner, outside the state lock. */
void db_autocheckpoint(struct db *db, int pages);
/* Closes the handle; NULL is a no-op. */
void db_close(struct db *db);

int db_begin(struct db *db) __attribute__((warn_unused_result));
int db_commit(struct db *db) __attribute__((warn_unused_result));
void db_rollback(struct db *db);

/* Inserts the session if it is new (the first master_ip is kept), with a
 * new random exec token. */
int db_session_touch(struct db *db, const char *name, const char *master_ip)
    __attribute__((warn_unused_result));

/* The session name as {"name", "master_ip", "created_at", "exec_token"}:
 * a new reference, or NULL if there is none. The exec token is a secret
 * for the session's holders of the API token and its workers. */
json_t *db_session_json(struct db *db, const char *name);

/* Inserts a worker in state scheduling, and its creation event. */
int db_worker_insert(struct db *db, const struct db_worker_new *w)
    __attribute__((warn_unused_result));

/* Sets status (and the given fields) of worker id, and appends the event
 * row (from -> to, detail). Call inside db_begin/db_commit. */
int db_worker_transition(struct db *db, const char *id, const char *from, const char *to,
                         const struct db_fields *f, const char *detail)
    __attribute__((warn_unused_result));

/* Records a heartbeat (its time) and the heartbeat interval the worker was
 * last told, without a state change. */
int db_worker_touch_heartbeat(struct db *db, const char *id, int64_t interval_ms)
    __attribute__((warn_unused_result));

/* What a worker uses (usage_* columns), live or final. */
struct db_usage {
  double cpu_seconds;
  long long memory_bytes, memory_peak_bytes;
};
int db_worker_usage(struct db *db, const char *id, const struct db_usage *u)
    __attribute__((warn_unused_result));

/* The API's worker object for id: a new reference, or NULL if there is no
 * such worker (or on error). */
json_t *db_worker_json(struct db *db, const char *id);

/* One page of worker ids, newest first, filtered by statuses (a JSON array
 * of names, or NULL for all), session, sessions starting with prefix, role
 * and run (NULL for any): at most
 * limit ids (ids has room for limit) of workers older than the cursor
 * before (0: from the newest), their number in *n. *next is the cursor of
 * the page after this one, 0 if this is the last. */
int db_worker_page(struct db *db, const char *statuses_json, const char *session,
                   const char *prefix, const char *role, const char *run, int64_t before, int limit,
                   char (*ids)[16], int *n, int64_t *next) __attribute__((warn_unused_result));

/* Records the backend's reference of worker id's attempt (if that attempt
 * is still current and the worker live). */
int db_worker_set_ref(struct db *db, const char *id, int attempt, const char *ref)
    __attribute__((warn_unused_result));

/* Replaces worker id's token (a job's claim mints new ones). */
int db_worker_set_token(struct db *db, const char *id, const char *token)
    __attribute__((warn_unused_result));

/* Sets why a scheduling worker waits (NULL: it does not). */
int db_worker_set_waiting(struct db *db, const char *id, const char *why)
    __attribute__((warn_unused_result));

/* The retention pruner, the one path that deletes: picks up to max terminal
 * workers that finished before cutoff (an ISO time), deletes them with
 * their events in one transaction (and sessions older than cutoff that have
 * no worker left), and copies their ids to ids (room for max) with their
 * number in *n, so the caller can remove their files. */
int db_prune(struct db *db, const char *cutoff, int max, char (*ids)[16], int *n)
    __attribute__((warn_unused_result));

/* Facts the controller needs about a worker, copied out of the row. */
struct db_worker_info {
  char id[16];
  char status[16];
  char token[72];
  char session[SESSION_STORED_MAX];
  char master_ip[48];
  char bind_ip[48];
  char gpu_indices[256];
  char kernel[256];
  double cpu, memory;
  int nvidia_gpu;
  long pid; /* -1 if none */
  int attempt;
  char launch_id[16];
  char *backend_ref; /* NULL if none */
  char *script, *code, *command_json, *args_json, *env_json, *secret_env_json;
  char *name, *role;
  char *cwd, *path;                 /* NULL if the launch gave none */
  char run[16];                     /* the run it belongs to ("" if none) */
  int64_t heartbeat_interval_ms;    /* the interval it was last told (0: none recorded) */
  char owner[SESSION_USER_MAX + 1]; /* the user who launched it ("": the bootstrap administrator) */
  char hostname[256];               /* the one it registered with ("": none) */
  int nomem; /* one of the malloc'ed texts could not be copied (it reads NULL) */
};

/* Fills *out for worker id. Returns 0, MUSTER_E_NOT_FOUND, or another error.
 * The heap strings in *out are freed by db_worker_info_cleanup(). */
int db_worker_info(struct db *db, const char *id, struct db_worker_info *out)
    __attribute__((warn_unused_result));
void db_worker_info_cleanup(struct db_worker_info *info);

/* Calls fn for every worker that is not in a terminal state, oldest first. */
int db_live_workers(struct db *db, void (*fn)(void *arg, const struct db_worker_info *w), void *arg)
    __attribute__((warn_unused_result));

/* Appends to *out up to limit events with seq > since, as SSE records
 * ("id: N\ndata: {...}\n\n"). *last is set to the last seq written.
 * Returns the number of events, or a negative error. *out is malloc'ed
 * (caller frees) and may be NULL when 0 is returned. */
MUST_CHECK int db_events_since(struct db *db, int64_t since, int limit, char **out, size_t *outlen,
                               int64_t *last);
/* The same, of the events of workers whose session starts with prefix,
 * with seq <= upto too (a caller who sees only their own sessions). */
MUST_CHECK int db_events_since_scoped(struct db *db, int64_t since, int64_t upto,
                                      const char *prefix, int limit, char **out, size_t *outlen,
                                      int64_t *last);

/* The newest limit events of worker id, oldest first, as a new JSON array
 * of {"seq", "from", "to", "at", "detail"} in *out (caller decrefs), and in
 * *truncated whether older ones were left out. Returns 0,
 * MUSTER_E_NOT_FOUND (no such worker), MUSTER_E_NOMEM or MUSTER_E_DB; *out
 * is NULL on an error. */
MUST_CHECK int db_worker_events(struct db *db, const char *id, int limit, json_t **out,
                                int *truncated);

/* Largest event seq (0 if none). */
int64_t db_last_event_seq(struct db *db);

/* Counts of workers per status, as a new JSON object {status: count}: the
 * ended ones (succeeded, failed, stopped) counted, every other status 0
 * (the state module counts the live ones, state_live_counts()). */
json_t *db_ended_counts(struct db *db);
/* Calls fn for each live worker that has a usage sample, by id. */
void db_live_usage(struct db *db, void (*fn)(void *arg, const char *id, const struct db_usage *u),
                   void *arg);

/* Sets worker id's run; MUSTER_E_CONFLICT if it has one (or is gone). */
int db_worker_set_run(struct db *db, const char *id, const char *run)
    __attribute__((warn_unused_result));

/* ---- sessions' leases and runs ---- */

/* Records holder's part of session's lease (ttl in seconds; stop_workers:
 * whether the part keeps the session's workers), live again if it had
 * expired. The session row is made if it is new. */
MUST_CHECK int db_holder_set(struct db *db, const char *session, const char *holder, double ttl,
                             int stop_workers);
/* Forgets holder's part (given back). */
MUST_CHECK int db_holder_drop(struct db *db, const char *session, const char *holder);
/* Marks holder's part expired now; workers_stopped: whether the session's
 * workers were stopped with it. */
MUST_CHECK int db_holder_expire(struct db *db, const char *session, const char *holder,
                                int workers_stopped);
/* Notes on every expired part of session's lease that the session's
 * workers have been stopped since (their holders are told so). */
MUST_CHECK int db_holders_stopped(struct db *db, const char *session);
/* Whether holder's part of session's lease expired (1, *workers_stopped
 * set) or not (0: live, given back or never taken); < 0: a database error. */
int db_holder_past(struct db *db, const char *session, const char *holder, int *workers_stopped);
/* Calls fn for every live part of every session's lease. */
MUST_CHECK int db_holders(struct db *db,
                          void (*fn)(void *arg, const char *session, const char *holder, double ttl,
                                     int stop_workers),
                          void *arg);

/* A new run in status running. command_json: a JSON array. */
struct db_run_new {
  const char *id, *session, *mode, *command_json, *holder;
  int max_restarts;
};
MUST_CHECK int db_run_insert(struct db *db, const struct db_run_new *r);
/* The API's run object: a new reference, or NULL if there is no such run.
 * full: with its stall reports (a list's runs say only how many). */
json_t *db_run_json(struct db *db, const char *id, int full);
/* One page of run ids, newest first, filtered by session and status (NULL:
 * any), of sessions starting with prefix (NULL: any); paged as
 * db_worker_page(). */
MUST_CHECK int db_run_page(struct db *db, const char *session, const char *prefix,
                           const char *status, int64_t before, int limit, char (*ids)[16], int *n,
                           int64_t *next);
/* Copies run id's status and session; MUSTER_E_NOT_FOUND if none. */
MUST_CHECK int db_run_state(struct db *db, const char *id, char *status, size_t slen, char *session,
                            size_t sesslen);
/* Records a restart of run id and its cause. MUSTER_E_NOT_FOUND, or
 * MUSTER_E_CONFLICT if the run ended or has used its max_restarts. */
MUST_CHECK int db_run_restart(struct db *db, const char *id, const char *cause);
/* Records a stall report of run id. MUSTER_E_NOT_FOUND, or
 * MUSTER_E_CONFLICT if the run ended or holds 20 reports already. */
MUST_CHECK int db_run_stall(struct db *db, const char *id, const char *report);
/* Ends run id with status (succeeded, failed or stopped), summary (JSON
 * text or NULL) and failure (or NULL). MUSTER_E_NOT_FOUND, or
 * MUSTER_E_CONFLICT if it had ended. */
MUST_CHECK int db_run_end(struct db *db, const char *id, const char *status,
                          const char *summary_json, const char *failure);
/* Fails every running run of session with failure; *n gets their number. */
MUST_CHECK int db_runs_fail_session(struct db *db, const char *session, const char *failure,
                                    int *n);
/* Fails every running run of session bound to holder; *n: their number. */
MUST_CHECK int db_runs_fail_holder(struct db *db, const char *session, const char *holder,
                                   const char *failure, int *n);

/* ---- runs' metrics (db_metrics.c) ---- */

/* Rows a series keeps before its neighbouring rows are merged in pairs (at
 * level 0, and at level 1: the same points, coarser), and the series a
 * run may have (names times ranks). */
#define METRIC_SERIES_ROWS 2000
#define METRIC_COARSE_ROWS 256
#define METRIC_RUN_SERIES 1024
/* The points one read answers at most, across its series. */
#define METRIC_READ_POINTS 200000

/* One value of one point, as it arrives. has_epoch: whether epoch is set. */
struct db_metric_in {
  const char *name;
  int64_t rank;
  int64_t step;
  double epoch;
  int has_epoch;
  double at; /* seconds since the epoch */
  double value;
};

/* Adds the n values p (in the order they were logged) to run's series,
 * inside the caller's transaction. Returns 0; MUSTER_E_INVALID when they
 * would take the run past METRIC_RUN_SERIES series; MUSTER_E_DB. Sorts p
 * (by series, keeping each series' order). */
MUST_CHECK int db_metrics_add(struct db *db, const char *run, struct db_metric_in *p, size_t n);

/* Whether sender's call seq of run was stored already (1), or not (0, and
 * it is recorded as stored, inside the caller's transaction); or
 * MUSTER_E_DB. */
MUST_CHECK int db_metrics_seen(struct db *db, const char *run, const char *sender, int64_t seq);

/* What a read of a run's metrics asks for: the names (NULL: all), the rows
 * written after since, and at most max_points points per series, each
 * bucket of merged points with its least and greatest value. */
struct db_metric_query {
  const char *const *names;
  size_t nnames;
  int64_t since;
  int max_points;
};

/* Writes the run's points to out as the members of the API's array
 * (grouped by series, each in order), and in *next the cursor of what
 * follows them. Returns 0 or MUSTER_E_DB. */
MUST_CHECK int db_metrics_query(struct db *db, const char *run, const struct db_metric_query *q,
                                FILE *out, int64_t *next);

/* The latest value of each name of run: {"name": {"step", "value",
 * "ranks"}}, the value of its lowest rank; an empty object if none. */
json_t *db_metrics_latest(struct db *db, const char *run);

/* The last SQLite error message, for logs. */
const char *db_errmsg(struct db *db);

#endif
