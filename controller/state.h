/*
 * state.h: the controller's one global state and its state machine.
 *
 * Lock order: there is one lock, state_lock(). Every function here whose
 * name does not end in _locked takes it itself; the _locked ones assert
 * that the caller holds it. libmicrohttpd's own locks may be taken while it
 * is held (MHD_resume_connection), never the other way round: MHD never
 * calls back into muster while holding a lock of its own.
 *
 * Every status change goes through sm_transition() between sm_begin() and
 * sm_commit(): the row update and its events row are one SQLite
 * transaction, and what follows from the change (waking awaits and event
 * streams, freeing capacity, admitting waiting workers) happens only once
 * that transaction has committed.
 */
#ifndef MUSTER_STATE_H
#define MUSTER_STATE_H

#include "db.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

enum wstatus {
  WS_SCHEDULING,
  WS_STARTING,
  WS_RUNNING,
  WS_SUCCEEDED,
  WS_FAILED,
  WS_STOPPED,
  WS_COUNT_
};

/* "scheduling", ...; the names used in the API and in SQLite. */
const char *ws_name(enum wstatus s);
/* Parses a status name; returns 0 or MUSTER_E_INVALID. */
int ws_parse(const char *name, enum wstatus *out) __attribute__((warn_unused_result));
int ws_terminal(enum wstatus s);
/* 1 if DESIGN.md's state machine allows from -> to. */
int sm_legal(enum wstatus from, enum wstatus to);

struct ctl_config {
  char listen_host[64];
  int port;
  char state_dir[512];
  char workdir[1024];
  char workerd_path[1024];
  char web_dir[1024];
  char backend[16];
  double start_timeout_s;
  double heartbeat_timeout_s;
  double heartbeat_interval_s;
  double stop_grace_s;
  double cpus;   /* capacity of the local backend */
  double memory; /* GiB */
  int gpus;
  int http_threads;
};

/* A worker that is not yet terminal, as the controller keeps it in memory.
 * Terminal workers live only in SQLite. */
struct lw {
  char id[16];
  char token[72];
  char session[72];
  enum wstatus status;
  double cpu, memory;
  int ngpu;
  uint64_t gpu_mask;
  int ip_slot;         /* -1 when none is held */
  pid_t pid;           /* workerd's pid (= its process group), 0 if none */
  int adopted;         /* started by an earlier controller: not our child */
  int reserved;        /* holds cores, memory, GPUs and an address */
  int64_t since_ms;    /* when it entered its current status */
  int64_t last_hb_ms;  /* last heartbeat (monotonic) */
  struct lw *next, *prev;  /* creation order */
  struct lw *hnext;        /* hash chain */
};

/* A suspended POST /workers/await (see api.c). */
struct waiter {
  struct MHD_Connection *conn;
  int wait_for_completion;
  int64_t deadline_ms; /* 0: none */
  int n;
  char (*ids)[16];
  unsigned char *done;
  int pending;
  int ready;     /* the answer can be built; the connection was resumed */
  int timed_out;
  struct waiter *next, *prev;
};

/* A suspended streaming answer (events or a followed log). */
enum stream_kind { STREAM_EVENTS, STREAM_LOG };
struct stream {
  enum stream_kind kind;
  struct MHD_Connection *conn;
  char worker_id[16];
  int suspended;
  int keepalive_due;
  struct stream *next, *prev;
};

struct ctl {
  pthread_mutex_t lock;
  int lock_held; /* for assertions: set while locked */
  pthread_cond_t kick;
  struct ctl_config cfg;
  struct db *db;
  char api_token[72];
  int token_new; /* created at this start: print it once */
  char controller_url[128];
  struct lw *head, *tail;
  struct lw *hash[4096];
  int live_count;
  double cpu_used, memory_used;
  uint64_t gpu_used;
  struct waiter *waiters;
  struct stream *streams;
  int schedule_needed;
  int shutting_down;
  int stopping_monitor;
  pthread_t monitor;
  int64_t last_keepalive_ms;
  /* Pending transitions of the open transaction, applied at commit. */
  struct pending {
    struct lw *w;
    enum wstatus to;
  } *pending;
  int npending, cap_pending;
  /* Process groups to SIGKILL once their grace period ends. */
  struct kill_later {
    pid_t pgid;
    int64_t at_ms;
  } *kills;
  int nkills, cap_kills;
  /* counters for /metrics */
  uint64_t http_requests;
  uint64_t transitions;
};

extern struct ctl g;

void state_lock(void);
void state_unlock(void);
#define ASSERT_LOCKED() assert(g.lock_held)

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
/* Adds a new scheduling worker to the live table. */
int lw_add_locked(const char *id, const char *token, const char *session, double cpu,
                  double memory, int ngpu) __attribute__((warn_unused_result));

int sm_begin(void) __attribute__((warn_unused_result));
/* Moves w to status to, setting f's columns, with an events row. Illegal
 * transitions return MUSTER_E_CONFLICT and change nothing. */
int sm_transition(struct lw *w, enum wstatus to, const struct db_fields *f, const char *detail)
    __attribute__((warn_unused_result));
/* Commits; then wakes whoever waits on the changes. On failure everything
 * since sm_begin() is rolled back. */
int sm_commit(void) __attribute__((warn_unused_result));
void sm_rollback(void);

/* How sm_finish_locked() ends a worker's processes. */
enum finish_kill {
  FINISH_KILL_NOW,        /* it is broken: SIGKILL its process group at once */
  FINISH_TERM_THEN_KILL,  /* a stop: SIGTERM now, SIGKILL after the grace period */
  FINISH_KILL_LATER,      /* it reported its end: SIGKILL leftovers after 2 s */
};

/* Moves a live worker to a terminal state in its own transaction, setting
 * f's columns (NULL: none; finished_at is always set), and ends its
 * processes as how says. w is freed on success. */
int sm_finish_locked(struct lw *w, enum wstatus to, struct db_fields *f, const char *detail,
                     enum finish_kill how) __attribute__((warn_unused_result));

/* sm_finish_locked() for a failure: f.failure = why, killed at once. */
int sm_fail_locked(struct lw *w, const char *why) __attribute__((warn_unused_result));

void waiter_add_locked(struct waiter *wt);
void waiter_remove_locked(struct waiter *wt);
void stream_suspend_locked(struct stream *s);
void stream_remove_locked(struct stream *s);
/* Resumes every suspended log stream of worker id. */
void streams_wake_logs_locked(const char *id);
/* Resumes every suspended event stream (new events were committed). */
void streams_wake_events_locked(void);

/* Wakes everything suspended so that the daemon can stop. */
void state_begin_shutdown(void);

#endif
