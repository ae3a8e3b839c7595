/*
 * backend.h: the one boundary between the state machine and the backends
 * that run workers (DESIGN: "Backends"; docs/internals/controller.md).
 *
 * The state machine (state.c) reaches a backend only through struct
 * backend_ops, and a backend reaches the state machine only through
 * backend_report(). The state machine never reaps a pid, sends a signal or
 * reads /proc; a backend never changes a worker's status itself.
 *
 * Locking: place, submit, cancel, release and ref_from_register are called
 * with the controller's state lock held; could_ever_fit and usage without
 * it (they read the configuration and the backend's own counters). None of
 * them may block (no spawn, no waiting on a process, no file I/O, no
 * sbatch): they record what to do and return; the backend's own thread does
 * the work and reports back through backend_report(), which takes the state
 * lock itself, so a backend must never call it while holding a lock of its
 * own. init, reconcile and shutdown are the exceptions: they run before the
 * API serves anything (in that order) or after it stopped, and may block.
 *
 * Exactly once: the state machine commits a worker's new attempt number (with
 * its `starting` state) before it calls submit; every workerd a backend
 * starts carries that number (MUSTER_WORKER_ATTEMPT) and the controller
 * refuses registrations from any other attempt. Reports name the attempt
 * too, and reports about an attempt that is no longer current are dropped.
 */
#ifndef MUSTER_BACKEND_H
#define MUSTER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct ctl_config;

/* What a worker asks for. */
struct backend_req {
  double cpu, memory; /* cores, GiB */
  int ngpu;
};

/* What a backend holds in all, when empty: a gang (a launch whose workers
 * must all run at once) larger than this can never start. */
struct backend_capacity {
  double cpu, memory; /* cores, GiB */
  int ngpu;
  long workers;      /* how many may be live at once */
  const char *where; /* in words: "this host" */
};

/* Where a backend placed a worker (filled by place()). */
struct backend_placement {
  char bind_ip[48];      /* address workerd binds to; "" to let it choose */
  char gpu_indices[256]; /* "0,1"; "" for none */
};

/* One worker handed to submit(): its attempt is already committed. */
struct backend_start {
  const char *id;
  const char *launch;         /* the launch (gang) it came from: a backend may group by it */
  const char *controller_url; /* where its workerd registers */
  const char *token;          /* the worker's bearer token: a secret */
  /* The account its commands run as: its user's --unix-user; "" for the
   * backend's own (--run-as). */
  const char *account;
  int attempt;
  const struct backend_req *req; /* what it asked for */
  const struct backend_placement *where;
};

/* One live worker an earlier controller left, handed to reconcile(). */
struct backend_live {
  const char *id;
  int attempt;
  int registered;  /* 1 if running (workerd registered) */
  const char *ref; /* backend_ref as recorded, or NULL if none was */
  struct backend_req req;
  struct backend_placement where;
  int adopted;   /* out: 1 if the recorded attempt still runs */
  char why[256]; /* out, when not adopted: why it ended ("" when unknown: a
                    starting or submitted worker then gets a new attempt) */
};

/* How cancel() ends a worker's processes. */
enum backend_cancel {
  BACKEND_KILL_NOW,       /* broken: end it at once */
  BACKEND_TERM_THEN_KILL, /* a stop: TERM now, KILL after the grace period */
  BACKEND_KILL_LATER,     /* it reported its own end: KILL leftovers after 2 s */
};

struct backend_ops {
  const char *name;
  /* 1 for a backend with a queue of its own (Slurm): place() never holds a
   * worker back; its attempt is committed and submitted while it stays
   * `scheduling`, with the backend's reason in waiting_for (BACKEND_WAITING),
   * until the backend reports BACKEND_STARTED, which makes it `starting`. A
   * launch is submitted whole, in one submit() call. Such a backend also
   * reports how its jobs end (BACKEND_LOST with its own words): when a
   * workerd says it was stopped from outside muster, the controller waits
   * a little for that report before it takes the workerd's words. */
  int queues;
  /* Prepares the backend and starts its thread. May block. Returns 0 or an
   * error with a sentence in err. */
  int (*init)(const struct ctl_config *cfg, char *err, size_t errlen);
  /* Stops the backend's thread. Workers keep running: a restarted
   * controller adopts them. May block. */
  void (*shutdown)(void);
  /* 0 if a worker of this size could fit the backend when empty; otherwise
   * MUSTER_E_CAPACITY with *field naming the field and a sentence in msg. */
  int (*could_ever_fit)(const struct backend_req *r, const char **field, char *msg, size_t msglen);
  /* Optional (NULL, or returning 0: unknown): fills *cap with what the
   * backend holds in all and returns 1. Without it a gang is not checked
   * as a whole (each worker still is, by could_ever_fit). Called without
   * the state lock. */
  int (*capacity)(struct backend_capacity *cap);
  /* Reserves room for a worker now. Returns 1 with *where filled, 0 with
   * a sentence in why ("2 cores (1.5 free of 2)") when it must wait, or -1
   * with a sentence in why when it cannot place it at all (out of memory):
   * the worker then fails, since nothing would try it again. */
  int (*place)(const char *id, const struct backend_req *r, struct backend_placement *where,
               char *why, size_t whylen);
  /* Starts the workers of one launch (their attempts are committed). What
   * happens is reported later: started, or refused. Returns 0, or -1 with a
   * sentence in why when it took none of them (out of memory): they then
   * fail at once, since nothing would report them. */
  int (*submit)(const struct backend_start *ws, int n, char *why, size_t whylen);
  /* Ends worker id's processes (if it has any) as how says. */
  void (*cancel)(const char *id, enum backend_cancel how);
  /* Gives back what id held (it became terminal). */
  void (*release)(const char *id);
  /* After a restart, before anything is started: sets adopted on each live
   * worker whose recorded attempt still runs and takes its room back. May
   * block. Returns 0, or MUSTER_E_NOMEM with a sentence in err when it had
   * no memory to record a worker it would adopt: it then adopts, sweeps and
   * ends nothing, and the start stops (the next one adopts them). */
  int (*reconcile)(struct backend_live *ws, int n, char *err, size_t errlen);
  /* Optional (NULL: the backend's own report is the only source of refs).
   * Forms the backend_ref of a workerd from what it said when it registered
   * (its pid and start time), for a registration that beats the backend's
   * own report of the start: the ref is then stored with the `running`
   * state, so a crash right after cannot leave a running worker the
   * backend does not know. Pure formatting: no I/O. Returns 0 or -1. */
  int (*ref_from_register)(long pid, unsigned long long start_time, char *ref, size_t len);
  /* Optional: what the backend makes of a request, in words, for the event
   * of its submission ("1 core per worker (0.5 asked; ...)"). */
  void (*describe)(const struct backend_req *r, char *buf, size_t len);
  /* Capacity, for /metrics and messages (NULL-safe). */
  void (*usage)(double *cpu_used, double *cpu_total, double *mem_used, double *mem_total);
  /* Optional: how workers are isolated, for /api/v1/health ("cgroup",
   * "none", "slurm"); NULL: "none". */
  const char *(*isolation)(void);
};

/* The backends compiled in; NULL if none has that name. */
const struct backend_ops *backend_find(const char *name);
/* "local" (and others, comma-separated), for --help and errors. */
const char *backend_names(void);

extern const struct backend_ops backend_local_ops;    /* backend_local.c */
extern const struct backend_ops backend_external_ops; /* backend_external.c */
extern const struct backend_ops backend_slurm_ops;    /* backend_slurm.c */

/* What a backend reports. */
enum backend_event {
  BACKEND_STARTED, /* the attempt's workerd exists; ref identifies it */
  BACKEND_REFUSED, /* could not start it: why */
  BACKEND_EXITED,  /* workerd ended before the worker's end was reported */
  BACKEND_LOST,    /* workerd vanished (node failure, gone after a restart): why */
  BACKEND_ROOM,    /* room held past a worker's end came free: schedule again (no id) */
  BACKEND_WAITING, /* queueing backends: still queued, detail says why */
  BACKEND_ENDING,  /* queueing backends: the job is ending (Slurm's COMPLETING);
                    * its account (LOST, with why) follows */
  BACKEND_RESTART, /* queueing backends: an attempt reconcile() kept while it could
                    * not tell, found never to have run: a new attempt, as
                    * reconcile's "" why gives (a running worker fails: detail) */
};

struct backend_report {
  enum backend_event event;
  const char *id;
  int attempt;
  const char *ref;    /* STARTED */
  const char *detail; /* STARTED: for the events row; others: the failure sentence */
};

/* The one entry point through which a backend tells the state machine what
 * happened. Takes the state lock; never call it holding a backend lock. */
void backend_report(const struct backend_report *r);

/* What one worker attempt uses, as its backend measured it (the local
 * backend: its cgroup). */
struct backend_usage {
  const char *id;
  int attempt;
  int final; /* its last sample: the worker's processes are gone */
  double cpu_seconds;
  long long memory_bytes, memory_peak_bytes;
};

/* Records n samples at once (one take of the state lock): a live worker's
 * goes to the database with the next heartbeat flush (at most once a
 * second), a final one of a worker that ended at once. */
void backend_report_usage(const struct backend_usage *u, int n);

#endif
