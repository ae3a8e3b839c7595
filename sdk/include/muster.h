/*
 * muster.h: the muster client library (libmuster).
 *
 * A client talks to one muster controller over its REST API (docs/design.md).
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

#include "muster_status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUSTER_WARN_UNUSED __attribute__((warn_unused_result))

typedef struct muster_client muster_client;

typedef enum muster_status {
#define MUSTER_X_STATUS(sym, name, terminal) MUSTER_##sym,
  MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
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
  int exec_port; /* 0 if unknown */
  char *backend, *backend_ref;
  int has_exit_code;
  int exit_code;
  int signal;    /* 0 if none */
  char *failure; /* the sentence saying why it failed, or NULL */
  char *created_at, *running_at, *finished_at, *last_heartbeat;
  char *json; /* the whole worker object as the controller sent it */
} muster_worker;

typedef struct muster_worker_list {
  size_t count;
  muster_worker *items;
} muster_worker_list;

/* What a worker uses, as its backend measured it (its `usage`). */
typedef struct muster_usage {
  double cpu_seconds;
  long long memory_bytes, memory_peak_bytes;
} muster_usage;

/* Fills *u from w's usage. Returns 1, or 0 where nothing measures it (the
 * controller says null). */
int muster_worker_usage(const muster_worker *w, muster_usage *u);

/* Why w waits in `scheduling` ("1 core (0 free of 2)"; "the Slurm queue:
 * Resources"), as the controller last recorded it: copies it into buf (size
 * bytes, cut to fit) and returns 1; returns 0 with buf "" when w waits for
 * nothing recorded (it is not scheduling, or no placement was tried yet). */
int muster_worker_waiting_for(const muster_worker *w, char *buf, size_t size);

void muster_worker_cleanup(muster_worker *w);
/* Frees the items of l and empties it; NULL is a no-op. */
void muster_worker_list_free(muster_worker_list *l);

/* Creates a client for the controller at url (e.g. "http://127.0.0.1:8470";
 * "127.0.0.1:8470", without a scheme, is taken as http://, as the Python
 * client does) with the API token. *out must be freed with
 * muster_client_free(). MUSTER_E_INVALID for a scheme other than http or
 * https, or a token that is empty or has spaces. */
int muster_client_new(const char *url, const char *token, muster_client **out) MUSTER_WARN_UNUSED;

/* Creates a client from the environment: MUSTER_URL and MUSTER_TOKEN, or
 * else the files url and token of the local controller's state directory
 * ($MUSTER_STATE_DIR, default ~/.muster). MUSTER_E_UNREACHABLE if neither
 * says where a controller is (muster_strerror() explains; no client is
 * made, so there is no errmsg to read). The state directory's token is
 * taken only for its own controller's URL or a loopback address:
 * MUSTER_E_UNAUTHORIZED for another URL without MUSTER_TOKEN. */
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

/* What to launch. muster_launch_opts_init() sets the defaults of docs/design.md
 * (n 1, cpu 1, memory 1, no GPU, kernel python3, session "default"). The
 * pointers are borrowed for the call. */
typedef struct muster_launch_opts {
  int n;
  double cpu, memory;
  int nvidia_gpu;
  const char *script, *code, *kernel;
  const char *const *command; /* argv, ncommand entries */
  size_t ncommand;
  const char *const *args; /* arguments of script/code/command */
  size_t nargs;
  const char *const *env; /* "NAME=value" strings */
  size_t nenv;
  const char *const *secret_env; /* "NAME=value"; never shown back */
  size_t nsecret_env;
  const char *role, *name, *session;
  const char *run; /* the run (muster_run_record_new()) the workers join, or NULL */
  /* Where the workers start, and relative scripts resolve (absolute):
   * NULL, this process's working directory (as CML's workers start in the
   * session's project directory), unless the environment has
   * MUSTER_SEND_CWD=0; "": the controller's --workdir. Not UTF-8:
   * MUSTER_E_INVALID naming cwd. */
  const char *cwd;
  /* The PATH the workers' commands are looked up on: NULL, this process's
   * PATH less its empty and "." entries (its commands are found as its
   * shell finds them), unless the environment has MUSTER_SEND_PATH=0; "":
   * the worker's own. An env PATH wins over both. Not UTF-8:
   * MUSTER_E_INVALID naming path. */
  const char *path;
} muster_launch_opts;

void muster_launch_opts_init(muster_launch_opts *o);

/* Launches o->n workers; *out gets them (free with
 * muster_worker_list_free()). */
int muster_launch(muster_client *c, const muster_launch_opts *o,
                  muster_worker_list *out) MUSTER_WARN_UNUSED;

/* Launches n (1..16) groups of workers, each of its own shape and role, as
 * one launch: a backend starts them as one gang (on Slurm, one job, a
 * heterogeneous one when the shapes differ). The groups share a session.
 * *out gets every worker, group after group. */
int muster_launch_groups(muster_client *c, const muster_launch_opts *groups, size_t n,
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
int muster_logs(muster_client *c, const char *id, muster_stream stream, int64_t offset, int follow,
                muster_data_cb cb, void *arg) MUSTER_WARN_UNUSED;

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

/* ---- exec: run a command inside a worker (docs/exec-protocol.md) ---- */

/* Where and how to reach one worker's exec channel. */
typedef struct muster_exec_target {
  char host[64];   /* the worker's ip_address */
  int port;        /* its exec_port */
  char token[128]; /* its session's exec token */
  char worker_id[16];
} muster_exec_target;

/* Copies session's exec token (a secret: for exec requests only) into buf. */
int muster_session_exec_token(muster_client *c, const char *session, char *buf,
                              size_t size) MUSTER_WARN_UNUSED;

/* Looks up worker id's address and its session's exec token. */
int muster_exec_target_get(muster_client *c, const char *id,
                           muster_exec_target *out) MUSTER_WARN_UNUSED;

/* Finds a worker's exec address in list, the comma-separated "ip:port"
 * exec addresses muster run hands its mpirun and its ranks
 * (MUSTER_EXEC_HOSTS: one per host; MUSTER_EXEC_RANKS: one per rank): the
 * entry whose ip is host, or if host is NULL the index-th (from 0). t gets
 * that address and token. Returns 0, or MUSTER_E_NOT_FOUND if the list has
 * no such entry. */
int muster_exec_list_find(const char *list, const char *host, long index, const char *token,
                          muster_exec_target *t) MUSTER_WARN_UNUSED;

typedef struct muster_exec_opts {
  const char *const *argv; /* the command, argc entries */
  size_t argc;
  const char *const *env; /* "NAME=value" on top of the worker's environment */
  size_t nenv;
  const char *cwd; /* NULL: the worker's working directory */
  int stdin_fd;    /* relayed to the command; -1: none (closed at once) */
  /* Output: handed to the callbacks if set, else written to the fds (-1:
   * dropped). */
  int stdout_fd, stderr_fd;
  muster_data_cb on_stdout, on_stderr;
  void *arg;
  const volatile int *cancel; /* if set and it becomes non-zero, the command is ended */
} muster_exec_opts;

/* Fills o with: no stdin, output to our own stdout/stderr. */
void muster_exec_opts_init(muster_exec_opts *o);

/* Runs a command in the worker at t and waits for it. *exit_code gets its
 * exit code, or 128 + the signal that killed it. Returns 0 when the command
 * ran (whatever its exit code), MUSTER_E_UNREACHABLE if the worker could not
 * be reached or the connection broke, MUSTER_E_FORBIDDEN if the worker
 * refused the token, MUSTER_E_NOT_FOUND if the program does not exist
 * there, MUSTER_E_SHUTTING_DOWN when o->cancel ended it. The connection is
 * given 10 s. errbuf gets a sentence; it is also set when the worker
 * refused to run the command (a missing working directory, a program it may
 * not run: 0, *exit_code 126) or lost track of it (0, *exit_code -1).
 * Needs no client: it talks to the worker. */
int muster_exec_at(const muster_exec_target *t, const muster_exec_opts *o, int *exit_code,
                   char *errbuf, size_t errlen) MUSTER_WARN_UNUSED;
/* As muster_exec_at(), and *signo gets the signal that killed the command
 * (*exit_code is then 128 + it), or 0 when it exited or never ran: an exit
 * code of 137 can be either. signo may be NULL (as muster_exec_at()). */
int muster_exec_at_signal(const muster_exec_target *t, const muster_exec_opts *o, int *exit_code,
                          int *signo, char *errbuf, size_t errlen) MUSTER_WARN_UNUSED;

/* ---- run_cluster: launch, build the cluster spec, train, stop ---- */

/* ---- sessions' leases ----
 *
 * As in CML, workers can end with the client that launched them: a client
 * holds a part of its session's lease, under a holder id of its own, and
 * renews it every ttl/3. A session's lease is the union of its holders'
 * parts: when the last of them stops renewing (the process died, the
 * laptop went away), the controller stops every live worker of the session
 * within that holder's ttl, each with "stopped: the session's lease
 * expired". One holder's part running out ends only the runs it recorded. */

typedef struct muster_lease muster_lease;

/* Takes session's lease for ttl_seconds (<= 0: 30) and renews it from a
 * thread of its own, on a connection of its own. Returns 0 once the lease
 * is held, with *out to end with muster_lease_end(). */
int muster_lease_start(muster_client *c, const char *session, double ttl_seconds,
                       muster_lease **out) MUSTER_WARN_UNUSED;

/* How muster_lease_end() leaves the session. */
typedef enum muster_lease_end_how {
  MUSTER_LEASE_STOP_WORKERS, /* give this holder's part back and stop the session's live workers,
                                unless another holder's part keeps them (a clean close) */
  MUSTER_LEASE_RELEASE,      /* give this holder's part back; the workers stay */
  MUSTER_LEASE_ABANDON       /* stop renewing only: the part runs out as if the process died */
} muster_lease_end_how;

/* Stops renewing and leaves the session as how says; frees l (NULL: no-op).
 * Returns 0, or the error of the last call (the lease then runs out by
 * itself). */
int muster_lease_end(muster_lease *l, muster_lease_end_how how);

/* Copies into buf (size bytes) why the last renewal failed, or that this
 * holder's part had expired before it (saying whether the session's
 * workers were stopped then, or other holders kept them); "" while all is
 * well. Returns buf. A renewal that fails is tried again every second. */
const char *muster_lease_error(muster_lease *l, char *buf, size_t size);

/* The holder id l holds its part under (owned by l). */
const char *muster_lease_holder(const muster_lease *l);

/* ---- runs ---- */

/* Records a run (mode, the command) in session with up to max_restarts
 * restarts; its id (like "r-3kf9x2m1qa") into id (16 bytes). The run is
 * bound to holder (muster_lease_holder() of a lease on session): it fails
 * when that holder's part of the lease ends before the run does. */
int muster_run_record_new(muster_client *c, const char *session, const char *holder,
                          const char *mode, const char *const *argv, size_t argc, int max_restarts,
                          char id[16]) MUSTER_WARN_UNUSED;
/* Records a restart of run id and its cause (UTF-8 text, else
 * MUSTER_E_INVALID). */
int muster_run_record_restart(muster_client *c, const char *id,
                              const char *cause) MUSTER_WARN_UNUSED;
/* Ends run id: status "succeeded", "failed" or "stopped", summary (JSON
 * text, or any text, kept as a string; NULL: none) and failure (UTF-8 text,
 * else MUSTER_E_INVALID; NULL: none). */
int muster_run_record_end(muster_client *c, const char *id, const char *status, const char *summary,
                          const char *failure) MUSTER_WARN_UNUSED;

typedef struct muster_run_info {
  char id[16];
  char *session, *mode, *status, *failure, *created_at, *finished_at;
  int restarts, max_restarts;
  size_t nworkers;
  char *json; /* the whole run object as the controller sent it */
} muster_run_info;

typedef struct muster_run_info_list {
  size_t count;
  muster_run_info *items;
} muster_run_info_list;

void muster_run_info_list_free(muster_run_info_list *l);

/* One page of runs, newest first: of session and status (NULL: any), at most
 * limit (0: the controller's default), older than the cursor before (NULL:
 * from the newest); next (NULL or 32 bytes) gets the next page's cursor, ""
 * after the last page. */
int muster_runs(muster_client *c, const char *session, const char *status, int limit,
                const char *before, muster_run_info_list *out, char *next) MUSTER_WARN_UNUSED;

/* The run object of id (its workers, restarts, summary, latest values) as
 * JSON text in *json (free()). */
int muster_run_get(muster_client *c, const char *id, char **json) MUSTER_WARN_UNUSED;

/* ---- Metrics (docs/design.md, "Metrics") ---- */

/* A logger of one process's points, sent to its run from a thread of its
 * own. */
typedef struct muster_metrics muster_metrics;

/* Opens a logger for run. url, run and token NULL take
 * MUSTER_CONTROLLER_URL, MUSTER_RUN_ID and MUSTER_RUN_TOKEN, which every
 * worker of a run has (anyone else passes a client's URL and token). rank
 * below 0 takes RANK, OMPI_COMM_WORLD_RANK or PMIX_RANK, else 0. What is
 * logged is sent every interval_s (0: 1 s). Returns 0,
 * MUSTER_E_NOT_FOUND when there is no run to send to, MUSTER_E_INVALID,
 * or MUSTER_E_NOMEM. */
int muster_metrics_open(const char *url, const char *run, const char *token, long rank,
                        double interval_s, muster_metrics **out) MUSTER_WARN_UNUSED;

/* Logs one point of step (epoch below 0: none): names[i] = values[i], i <
 * n (1..64; a NaN or infinity is sent as null, which the controller
 * skips). It copies them under a lock and returns: it never waits on the
 * network and never fails the caller's work. A controller that does not
 * answer costs a line on stderr; up to 100,000 values wait for it, and
 * newer ones are dropped (counted) past that. Returns 0 or
 * MUSTER_E_INVALID. */
int muster_log_metrics(muster_metrics *m, int64_t step, double epoch, const char *const *names,
                       const double *values, size_t n);

/* The values sent so far, and those dropped (refused, or past the 100,000
 * that may wait). */
void muster_metrics_counts(muster_metrics *m, uint64_t *sent, uint64_t *dropped);

/* Sends what is left (each call waiting at most timeout_s, or the 10 s of
 * a call already on the wire) and frees m. */
void muster_metrics_close(muster_metrics *m, double timeout_s);

/* GET /api/v1/runs/{run}/metrics: names (a comma list, NULL: all), the
 * points written after since (0: all), at most max_points per series (0:
 * the controller's default). The answer as JSON text in *json (free()). */
int muster_run_metrics(muster_client *c, const char *run, const char *names, int64_t since,
                       int max_points, char **json) MUSTER_WARN_UNUSED;

/* ---- Users (docs/design.md, "Users") ----
 * Each call hands back the controller's JSON answer as text in *json
 * (free()); NULL when it fails. */

/* {"user", "admin", "run_as"}: whose token this client carries. */
int muster_whoami(muster_client *c, char **json) MUSTER_WARN_UNUSED;

/* A new user's settings; limits below 0 (as muster_user_opts_init() sets
 * them) are none. */
typedef struct muster_user_opts {
  int admin;
  const char *unix_user; /* the account their workers run as (NULL: --run-as) */
  double max_cpu, max_memory;
  int max_gpus, max_workers;
} muster_user_opts;
void muster_user_opts_init(muster_user_opts *o);

/* Administrators: {"users": [user]}. */
int muster_users_list(muster_client *c, char **json) MUSTER_WARN_UNUSED;
/* Administrators: {"user", "token"}; the only time the token is shown. */
int muster_user_add(muster_client *c, const char *name, const muster_user_opts *o,
                    char **json) MUSTER_WARN_UNUSED;
/* An administrator, or that user: the user object. */
int muster_user_get(muster_client *c, const char *name, char **json) MUSTER_WARN_UNUSED;
/* Administrators: {"token"}, a new one; the old one is dead at once. */
int muster_user_token(muster_client *c, const char *name, char **json) MUSTER_WARN_UNUSED;
/* Administrators: {"removed"}; refused (MUSTER_E_CONFLICT) while the user
 * owns live workers, unless stop: then they are stopped with it. */
int muster_user_remove(muster_client *c, const char *name, int stop,
                       char **json) MUSTER_WARN_UNUSED;

typedef enum muster_run_mode {
  MUSTER_RUN_PS,        /* the command on every PS and worker, with TF_CONFIG */
  MUSTER_RUN_ALLREDUCE, /* mpirun in this session, orted started through exec */
  MUSTER_RUN_EXEC       /* the command on every worker, torchrun-style variables */
} muster_run_mode;

/* A line of a process's output (without its newline): role "ps", "worker"
 * or "mpirun", index, stream. Called from several threads, one at a time. */
typedef void (*muster_run_output_cb)(void *arg, const char *role, int index, muster_stream stream,
                                     const char *line, size_t len);

typedef struct muster_run_opts {
  muster_run_mode mode;
  int n_workers, n_ps;
  double cpu, memory;
  int nvidia_gpu;          /* per training worker (PS get none) */
  int port;                /* the cluster spec's port (default 2222) */
  double timeout_seconds;  /* for the workers to be running (default 60) */
  const char *const *argv; /* the command, argc entries */
  size_t argc;
  const char *session; /* NULL: a new session of its own, "run-<random>" */
  /* allreduce: the muster program, run as Open MPI's rsh agent ("<it> rsh")
   * and to start each rank inside its worker ("<it> rank"), or the
   * muster-launcher beside it where there is one; NULL: "muster", found on
   * the PATH. */
  const char *muster_program;
  muster_run_output_cb on_output;
  void *arg;
  /* ps: each parameter server's cores and GiB; 0: as a worker's. PS and
   * workers are one launch either way (on Slurm one job, a heterogeneous one
   * when their shapes differ). */
  double ps_cpu, ps_memory;
  /* Restarts after a failed worker or rank (torchrun's --max-restarts): all
   * workers are stopped and new ones started; muster-train resumes from its
   * last checkpoint (--resume), any other command starts again as it is,
   * with MUSTER_RESTART_COUNT set. 0: the first failure ends the run. */
  int max_restarts;
  /* The session's lease while the run lasts: its workers stop within
   * lease_ttl seconds of this process dying. 0: 30 s; < 0: no lease. */
  double lease_ttl;
  /* Where muster-train's checkpoint goes when the command names none
   * (it must be reachable from the workers: on the local backend and on
   * clusters with a shared home, the default is):
   * NULL: $MUSTER_RUN_DIR, else ~/.muster/runs, then /RUN_ID/checkpoint. */
  const char *run_dir;
  /* Called when a restart begins (attempt = 1, 2, ...), with its cause. */
  void (*on_restart)(void *arg, int attempt, const char *cause);
  /* Where the workers and their ranks start (muster_launch_opts' cwd):
   * NULL, this process's working directory (unless MUSTER_SEND_CWD=0);
   * "": the controller's --workdir (for allreduce, the ranks then start
   * where mpirun's daemons do). */
  const char *cwd;
  /* Called while the workers are not all running yet, with what they wait
   * for ("worker 2 (w-...) waits for 1 core (0 free of 2)"): after 2 s of
   * waiting, then whenever the reasons change (not their counts or free
   * amounts). NULL: not told. */
  void (*on_waiting)(void *arg, const char *what);
  /* The workers' PATH (muster_launch_opts' path): NULL, this process's
   * (unless MUSTER_SEND_PATH=0); "": the worker's own. */
  const char *path;
  /* A stall: no rank made progress (a new metric point, an output line,
   * or for a run that posts no metrics, CPU time) for stall_timeout
   * seconds (default 120; 0: not watched). Its report names each rank
   * with its worker, last step, state, CPU and stack (muster stack, inside
   * each worker), the rank behind the others first; it goes to on_stall
   * (NULL: not told) and to the run's record. on_stall_fail: the stall
   * fails the attempt like a failed rank (max_restarts may restart it). */
  double stall_timeout;
  int on_stall_fail;
  void (*on_stall)(void *arg, const char *report);
} muster_run_opts;

typedef struct muster_run_result {
  int exit_code;          /* 0 only if the training succeeded */
  char failed_worker[16]; /* the worker that failed first, or "" */
  char failure[4096];     /* why, in a sentence ("" on success); after restarts, every cause */
  char *summary;          /* the last line worker 0 / rank 0 printed (malloc'ed), or NULL */
  double start_s;         /* launch to all running */
  double run_s;           /* the command, start to end (the last attempt) */
  char run_id[16];        /* the run's record ("" if none could be made) */
  char lease_error[512];  /* what went wrong with its lease ("": nothing) */
  int restarts;           /* restarts it took */
} muster_run_result;

void muster_run_opts_init(muster_run_opts *o);
void muster_run_result_free(muster_run_result *r);

/* Launches n_ps + n_workers idle workers, awaits them, runs the command as
 * the mode says, streams its output to on_output, stops the rest as soon as
 * one fails, and stops every worker at the end. Returns 0 when it got as far
 * as running (see r->exit_code and r->failure), or an error of the
 * controller (launch refused, unreachable). */
int muster_run_cluster(muster_client *c, const muster_run_opts *o,
                       muster_run_result *r) MUSTER_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
