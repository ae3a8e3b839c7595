/*
 * state.h: the controller's one global state and its state machine.
 *
 * Lock order: state_lock() first; under it, leaf locks that are held
 * briefly and never around anything else: a backend's own (lb.mu), a
 * reader connection's, a cache stripe's (wcache.c). Every function here
 * whose name does not end in _locked takes the state lock itself; the
 * _locked ones assert that the caller holds it. libmicrohttpd's own locks
 * may be taken under it (MHD_resume_connection), never the other way round:
 * nothing may destroy a response or stop the daemon while holding it, since
 * a content reader runs under libmicrohttpd's response lock and takes it.
 * docs/internals/controller.md tells the whole story; state_internal.h
 * says which file does what.
 *
 * Every status change goes through sm_transition() between sm_begin() and
 * sm_commit(): the row update and its events row are one SQLite
 * transaction, and what follows from the change (waking awaits and event
 * streams, freeing capacity, admitting waiting workers) happens only once
 * that transaction has committed.
 */
#ifndef MUSTER_STATE_H
#define MUSTER_STATE_H

#include "backend.h"
#include "db.h"
#include "muster_status.h"
#include "session_name.h"
#include "users.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

/* The worker states, from the one table (muster_status.h). */
enum wstatus {
#define MUSTER_X_STATUS(sym, name, terminal) WS_##sym,
  MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
      WS_COUNT_
};

/* The live statuses come first: scheduling, starting, running. */
#define WS_LIVE_N (WS_RUNNING + 1)

/* "scheduling", ...; the names used in the API and in SQLite. */
const char *ws_name(enum wstatus s);
/* Parses a status name; returns 0 or MUSTER_E_INVALID. */
int ws_parse(const char *name, enum wstatus *out) __attribute__((warn_unused_result));
int ws_terminal(enum wstatus s);
/* 1 if the state machine (docs/design.md) allows from -> to. */
int sm_legal(enum wstatus from, enum wstatus to);

struct ctl_config {
  char listen_host[64];
  int port;
  char state_dir[512];
  char workdir[1024];
  char run_as[64]; /* the account workers' commands run as ("": the controller's own) */
  char tls_cert[1024], tls_key[1024]; /* --tls-cert, --tls-key ("": plain HTTP) */
  char workerd_path[1024];
  char web_dir[1024];
  char backend[16];
  double start_timeout_s;
  double heartbeat_timeout_s;
  double heartbeat_interval_s;
  double heartbeat_rate; /* heartbeats a second the intervals are stretched to (0: none) */
  int host_beat;         /* enum host_beat_mode: when workerds beat per host (heartbeat.c) */
  double stop_grace_s;
  double retain_s; /* terminal workers are pruned this long after they end */
  double cpus;     /* capacity of the local backend */
  double memory;   /* GiB */
  int gpus;
  int isolation; /* the local backend's: enum cg_isolation (cgroup.h) */
  int http_threads;
  char advertise_url[512]; /* where workers reach the controller ("": from --listen) */
  int network;             /* enum net_choice (network.h), --network */
  char subnet[40];         /* --subnet ("": the default) */
  /* The slurm backend. */
  char slurm_partition[128];
  char slurm_account[128];
  char *slurm_args[32]; /* --slurm-arg, in order (point into argv) */
  int nslurm_args;
};

/* How long a worker stopped from outside muster waits for its queueing
 * backend's account of the end: a poll or two, or, once the backend said
 * the job is ending (Slurm's COMPLETING lasts while the job's processes
 * die, up to KillWait, 30 s by default), for up to a minute. */
#define OUTSIDE_WAIT_MS 5000
#define OUTSIDE_ENDING_WAIT_MS 60000

/* One worker's place in a short list of live workers (struct lw_list). */
struct lw_link {
  struct lw *next, *prev;
  int in; /* listed */
};

/* A list of live workers, oldest first, threaded through one of their
 * struct lw_link (live.c: lw_list_append, lw_list_remove). */
struct lw_list {
  struct lw *head, *tail;
  int n;
};

/* What one user's live workers hold (user_live.c), kept as the live table
 * changes: a launch's quota check and /metrics read no rows for it. */
struct user_live {
  char name[USER_NAME_MAX + 1]; /* "": the bootstrap administrator */
  /* in millionths of a core and of a GiB: integers add and subtract
   * exactly, in any order, however long the user keeps workers live */
  long long cpu_micro, memory_micro;
  long gpus, workers;
  struct user_live *next; /* in g.users_live, by name */
};

/* A worker that is not yet terminal, as the controller keeps it in memory.
 * Terminal workers live only in SQLite. */
struct lw {
  char id[16];
  char token[72];
  /* a registration traded its token for a new one (rotate, api_worker.c)
   * and no call has come with the new one yet: the same workerd's retry
   * (same pid, the answer was lost) with the old one is answered. Cleared
   * by the first call made with the new token. */
  int rotation_open;
  uint64_t exec_refused; /* its workerd's count, as its last heartbeat said */
  uint32_t host_hash;    /* util_fnv1a() of the hostname it registered with */
  int64_t last_vouch_ms; /* when its heartbeat last spoke for others (host beats) */
  uint32_t vouch_seq;    /* the vouching call (g.vouch_seq) that last spoke for it */
  char session[SESSION_STORED_MAX];
  char launch[16]; /* the launch (gang) it came from */
  enum wstatus status;
  int attempt;   /* the committed start attempt (0: never started) */
  int restart;   /* starting, but its attempt is not running: start anew */
  int ref_known; /* the backend reported the attempt's process */
  long reg_pid;  /* the pid its workerd registered with (0: none yet) */
  /* stdout, stderr: the position in the stream just past the last byte its
   * workerd's log POSTs delivered (their pos, api_log_append()): a POST
   * sent again after its answer was lost (a timeout) adds only what is
   * new. Not kept across a controller restart. */
  uint64_t log_end[2];
  struct backend_req req;
  char waiting_for[160];
  int64_t since_ms;            /* when it entered its current status */
  int64_t last_hb_ms;          /* last heartbeat (monotonic) */
  int64_t hb_interval_ms;      /* the heartbeat interval it was last told (0: none yet) */
  int64_t hb_prev_interval_ms; /* the one told before it */
  int hb_dirty;                /* a heartbeat not yet written to SQLite */
  struct lw_link dirty_link;   /* in g.dirty: hb_dirty or usage_dirty was set */
  struct lw_link queue_link;   /* in g.queue: it may want a start */
  struct db_usage usage;       /* the backend's last sample */
  int usage_dirty;             /* a sample not yet written to SQLite */
  int dropping;                /* sm_commit(): terminal, leaving the table */
  /* Its workerd said it was stopped from outside muster (a queueing
   * backend's cancel or time limit): the backend's own account of the end
   * is awaited until outside_until_ms (OUTSIDE_WAIT_MS, or
   * OUTSIDE_ENDING_WAIT_MS once the backend said the job is ending), then
   * outside_why is the failure. */
  char *outside_why;
  int64_t outside_until_ms;
  int outside_signal; /* the signal workerd reported with it, or 0 */
  int ending;         /* the backend said its job is ending (BACKEND_ENDING) */
  /* starting, but a queueing backend says its new attempt waits in the
   * queue (after a restart): the start timeout waits too. */
  int queued;
  struct user_live *owner; /* its user's sums, which count it */
  struct lw *next, *prev;  /* creation order */
  struct lw *hnext;        /* hash chain */
};

struct watch;

/* One id of a suspended await. While the id is pending and the await is not
 * ready, the slot is listed under that id in the watch index (waiters.c), so
 * that a change of that worker reaches only the awaits that name it. */
struct waiter_slot {
  struct waiter *wt;
  int i;                           /* its index in wt->ids */
  struct watch *key;               /* the index entry it is listed in; NULL: none */
  struct waiter_slot *next, *prev; /* in key->slots */
};

/* A suspended POST /workers/await (see api_await.c, which allocates and
 * frees it). */
struct waiter {
  struct MHD_Connection *conn;
  int wait_for_completion;
  int64_t deadline_ms; /* 0: none */
  int n;
  char (*ids)[16];
  unsigned char *done;
  struct waiter_slot *slots; /* n of them, one per id */
  int pending;
  int ready; /* the answer can be built; the connection was resumed */
  int timed_out;
  int client_gone;            /* the client hung up while it waited */
  int shut_down;              /* woken by the controller's shutdown */
  struct waiter *next, *prev; /* in g.waiters */
};

/* A suspended streaming answer (events or a followed log). */
enum stream_kind { STREAM_EVENTS, STREAM_LOG };
struct stream {
  enum stream_kind kind;
  struct MHD_Connection *conn;
  char worker_id[16];
  int listed;    /* in g.streams, from its start to its end */
  int suspended; /* waiting for a wake */
  int pending;   /* woken while it was not suspended: look again */
  int keepalive_due;
  int client_gone;            /* the client hung up: end the answer */
  int too_slow;               /* the client fell too far behind: end it with a retry hint */
  int64_t wake_at_ms;         /* util_mono_ms() time the monitor wakes it (0: none) */
  struct stream *next, *prev; /* in g.streams (all of them) */
  /* An event stream is also in g.event_streams; a log stream is in its
   * worker's watch index entry (key->logs). */
  struct watch *key;
  struct stream *inext, *iprev;
};

/* The watch index (waiters.c): for one worker id, the pending await slots
 * and the log streams that name it. An entry exists while either list is
 * not empty. */
struct watch {
  char id[16];
  struct waiter_slot *slots;
  struct stream *logs;
  struct watch *hnext; /* hash chain of g.watch */
};

struct ctl {
  pthread_mutex_t lock; /* error-checking: a relock or a foreign unlock aborts */
  pthread_t lock_owner;
  int lock_held; /* with lock_owner: who holds the lock, for assertions */
  pthread_cond_t kick;
  struct ctl_config cfg;
  const struct backend_ops *backend;
  int backend_started;
  struct db *db;
  char api_token[72];
  int token_new; /* created at this start: print it once */
  char controller_url[600];
  /* Where workers reach the controller: the bridge's gateway in bridge
   * mode (network.h), else controller_url; --advertise-url sets both. */
  char worker_url[600];
  struct lw *head, *tail;
  /* by id: 65,536 chains, a few workers each at 100,000 live */
  struct lw *hash[65536];
  /* the workers with a heartbeat or a sample not yet written (heartbeat.c) */
  struct lw_list dirty;
  int64_t last_scan_ms;
  struct lw *scan_next; /* where the next timeout scan goes on (heartbeat.c) */
  /* the start queue: the workers that may want a start, each new one and
   * each one given a new attempt; schedule_locked() drops those that do
   * not (a superset, so that a pass walks these only) */
  struct lw_list queue;
  int live_count;
  int beating; /* live workers starting or running: they heartbeat (atomic writes) */
  /* the live workers by status (atomic writes): what /metrics and the
   * health call count, without reading every live row */
  int live_by_status[WS_LIVE_N];
  uint64_t launches;            /* launches since start, for launch ids */
  struct user_live *users_live; /* each user who had a live worker since the start */
  struct waiter *waiters;
  /* awaits woken whose answer has not yet gone out (atomic): a shutdown
   * waits for them (a while) before it closes the connections */
  int awaits_answering;
  struct stream *streams;
  struct stream *event_streams;
  struct watch *watch[4096]; /* by worker id: who waits on that worker */
  int schedule_needed;
  /* After a scheduling pass that failed (its commit, memory): no pass
   * before this time (monotonic ms), so that a database that keeps failing
   * does not keep the monitor on the state lock (sched.c) */
  int64_t schedule_retry_ms;
  int shutting_down;
  int stopping_monitor;
  pthread_t monitor;
  int64_t last_keepalive_ms;
  /* Pending transitions of the open transaction, applied at commit. */
  struct pending {
    struct lw *w;
    enum wstatus to; /* the status before: a rollback puts it back */
    int attempt;     /* likewise, with what a new attempt resets */
    int restart, ref_known;
    int64_t since_ms;
  } * pending;
  int npending, cap_pending;
  int64_t last_hb_flush_ms;
  int64_t last_prune_ms;
  /* The last moment a client could not be served (a connection refused at
   * the limit, api_guard.c; atomic): the monitor gives leases and
   * heartbeats that time back (monitor.c). */
  int64_t unserved_at_ms;
  /* counters for /metrics */
  uint64_t http_requests;
  uint64_t transitions;
  uint64_t leases_expired;
  uint64_t unserved_ms;  /* time given back to leases and heartbeats (monitor.c) */
  uint64_t exec_refused; /* exec connections workerds refused before the token */
  uint64_t hb_calls;     /* heartbeat calls answered */
  uint64_t hb_vouched;   /* heartbeats a sibling's call carried (host beats) */
  uint32_t vouch_seq;    /* vouching calls so far (each worker named once a call) */
};

extern struct ctl g;

/* The live workers by status (scheduling, starting, running), without the
 * state lock: each count as it was a moment ago. */
void state_live_counts(long out[WS_LIVE_N]);

void state_lock(void);
void state_unlock(void);
/* Aborts with a message unless the calling thread holds the state lock; on
 * in every build, since a silent misuse would be a deadlock or a race. */
void state_assert_locked(const char *func);
#define ASSERT_LOCKED() state_assert_locked(__func__)

/* Opens the database, reads or creates the API token, and re-attaches the
 * workers an earlier controller left live. Returns 0 or an error with a
 * sentence in err. */
int state_init(const struct ctl_config *cfg, char *err, size_t errlen)
    __attribute__((warn_unused_result));
/* Starts/stops the monitor thread (scheduling, timeouts, reaping). */
int state_start_monitor(void) __attribute__((warn_unused_result));
void state_stop_monitor(void);
void state_cleanup(void);

/* Wakes the monitor thread now (after a launch, or when room freed up). */
void state_kick_locked(void);

struct lw *lw_find_locked(const char *id);
/* A launch's workers enter the live table in two steps, so that the only
 * step that can fail (for memory) comes before their rows are committed:
 * lw_reserve_locked() allocates one for owner ("": the bootstrap
 * administrator) and returns it, or NULL when out of memory;
 * lw_link_locked() makes it a scheduling worker in the table (which then
 * owns it: lw_remove_locked() frees it), and cannot fail; lw_unreserve()
 * frees one that was not linked. */
struct lw *lw_reserve_locked(const char *owner) __attribute__((warn_unused_result));
void lw_link_locked(struct lw *w, const char *id, const char *token, const char *session,
                    const char *launch, const struct backend_req *req);
void lw_unreserve(struct lw *w);
/* What name's live workers hold ("": the bootstrap administrator's). */
void user_live_get_locked(const char *name, struct user_usage *out);
/* Calls fn for each user who has live workers, by name (the bootstrap
 * administrator first, as USER_BOOTSTRAP). */
void user_live_each_locked(void (*fn)(void *arg, const char *user, const struct user_usage *u),
                           void *arg);

int sm_begin(void) __attribute__((warn_unused_result));
/* Moves w to status to, setting f's columns, with an events row. Illegal
 * transitions return MUSTER_E_CONFLICT and change nothing. */
int sm_transition(struct lw *w, enum wstatus to, const struct db_fields *f, const char *detail)
    __attribute__((warn_unused_result));
/* Commits; then wakes whoever waits on the changes. On failure everything
 * since sm_begin() is rolled back. */
int sm_commit(void) __attribute__((warn_unused_result));
void sm_rollback(void);

/* Moves a live worker to a terminal state in its own transaction, setting
 * f's columns (NULL: none; finished_at is always set), and has the backend
 * end its processes as how says. w is freed on success. */
int sm_finish_locked(struct lw *w, enum wstatus to, struct db_fields *f, const char *detail,
                     enum backend_cancel how) __attribute__((warn_unused_result));

/* Stops the live workers of ids (n of them) in one transaction, each with
 * detail as its event and failure (NULL: none) as its failure; terminal or
 * unknown ones are skipped. */
int sm_stop_many_locked(char (*ids)[16], int n, const char *detail, const char *failure)
    __attribute__((warn_unused_result));
/* The same, with also(arg) run inside the transaction before it commits
 * (its writes commit with the stops, or nothing does). */
MUST_CHECK int sm_stop_many_with_locked(char (*ids)[16], int n, const char *detail,
                                        const char *failure, int (*also)(void *arg), void *arg);

/* sm_finish_locked() for a failure: f.failure = why, killed at once. */
int sm_fail_locked(struct lw *w, const char *why) __attribute__((warn_unused_result));
/* Where workers reach the controller (--advertise-url, or from --listen).
 * Set before the backend starts; never changes after. */
const char *state_controller_url(void);

/* A worker that a queueing backend (backend_ops.queues) holds: its attempt
 * is committed and submitted, and it is still `scheduling` in the backend's
 * queue. */
static inline int lw_submitted(const struct lw *w) {
  return w->status == WS_SCHEDULING && w->attempt > 0;
}
/* scheduling -> starting for a submitted worker the backend started, in a
 * transaction of its own. */
MUST_CHECK int sm_start_submitted_locked(struct lw *w, const char *detail);

/* Lists a suspended await (its slots allocated, its done and pending set):
 * in g.waiters, and each pending id in the watch index. Returns 0, or
 * MUSTER_E_NOMEM with nothing listed. */
MUST_CHECK int waiter_add_locked(struct waiter *wt);
/* Takes an await out of g.waiters and the watch index (a no-op for one not
 * listed); the caller frees it after. */
void waiter_remove_locked(struct waiter *wt);
/* A streaming answer is listed from its start (stream_add_locked) to its
 * end (stream_remove_locked, from its free callback), so that wakes reach it
 * whether or not it is suspended at that moment. stream_add_locked returns
 * 0, or MUSTER_E_NOMEM with nothing listed (the free callback may still call
 * stream_remove_locked: a no-op then). */
MUST_CHECK int stream_add_locked(struct stream *s);
void stream_remove_locked(struct stream *s);
/* Called by a stream's reader that found nothing new (after reading without
 * the lock): returns 0 if a wake came meanwhile (read again), or 1 after
 * suspending the connection (the reader returns 0; a wake resumes it, or
 * the monitor once s->wake_at_ms, if set, has come). */
int stream_wait_locked(struct stream *s) __attribute__((warn_unused_result));
/* Resumes every suspended log stream of worker id. */
void streams_wake_logs_locked(const char *id);
/* Resumes every suspended event stream (new events were committed). */
void streams_wake_events_locked(void);

/* Records a heartbeat of w (in memory; written to SQLite in batches). */
void sm_heartbeat_locked(struct lw *w);
/* Lists w among the workers whose heartbeat or sample is to be written
 * (after setting hb_dirty or usage_dirty; live.c). */
void lw_dirty_locked(struct lw *w);
/* Appends w to the start queue (g.queue: a worker that may want a start,
 * looked at by the next scheduling pass), unless it is listed already. */
void lw_queue_locked(struct lw *w);
/* Records that w is told the heartbeat interval for the live workers now
 * (its heartbeat timeout follows it) and returns it in seconds: the
 * register and heartbeat answers carry it. */
double hb_tell_locked(struct lw *w);
/* The interval a worker would be told now (no lock needed). */
int64_t hb_interval_now_ms(void);

/* --host-beat: whether a host's workerds are told to beat together (one
 * speaks for its siblings; docs/internals/controller.md, "Liveness per
 * host"): always, never, or once the interval is stretched (the default). */
enum host_beat_mode { HOST_BEAT_AUTO, HOST_BEAT_ON, HOST_BEAT_OFF };
/* What the register and heartbeat answers say now ("host_beat"). */
int hb_host_beat_now(void);
/* How long a worker just vouched for may skip its own heartbeats, counted
 * from the start of the call that vouched: two intervals and a second, or
 * less where its timeout would not leave its own beat, due when that ends,
 * an interval and two seconds (0: none). Called locked. */
int64_t hb_cover_ms_locked(const struct lw *w);

/* Wakes everything suspended so that the daemon can stop. */
void state_begin_shutdown(void);

#endif
