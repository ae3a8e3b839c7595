/*
 * local_internal.h: what the parts of the local backend share (backend.h
 * says what a backend does; backend_local.c's opening comment, how this
 * one does it).
 *
 *   backend_local.c  the backend's thread (its loop hands work to the parts
 *                    below and gets results back), the job queue (submit,
 *                    cancel), init and shutdown, the operations table
 *   local_table.c    the backend's state (lb), its table of worker records
 *                    and the room they hold (cores, memory, GPUs,
 *                    addresses): could_ever_fit, place, release, usage
 *   local_signal.c   signals to a worker's whole session, checked against
 *                    its workerd's start time
 *   local_zygote.c   starting a workerd process: the fork server
 *                    (muster-workerd --zygote), or posix_spawn without it
 *   local_spawn.c    starting a batch of workers: their cgroups, their
 *                    settings, their STARTED or REFUSED reports
 *   local_reap.c     the ends of workers' processes: reaping, the KILLs due
 *                    after a grace period, the cgroup that goes with an end
 *   local_sample.c   usage sampling from workers' cgroups
 *   local_adopt.c    what an earlier controller left: reconcile, probing
 *                    adopted workers, sweeping cgroups no worker owns
 *
 * Calls point one way (no file calls one that calls it): backend_local.c
 * calls every part; local_adopt.c calls local_reap.c; local_reap.c calls
 * local_sample.c, local_zygote.c and local_signal.c; local_spawn.c calls
 * local_zygote.c and local_signal.c; every part but local_signal.c reads
 * local_table.c, which calls none. No part calls back into backend_local.c.
 *
 * Locking: lb.mu is a leaf lock (nothing else is taken while it is held,
 * and backend_report() is never called under it). Functions marked "(lb.mu
 * held)" expect it; the others take it themselves where they need it and
 * run on the backend's thread, or in reconcile (the thread runs by then,
 * but has no adopted record to act on and sweeps nothing until reconcile
 * has made them all).
 */
#ifndef MUSTER_LOCAL_INTERNAL_H
#define MUSTER_LOCAL_INTERNAL_H

#include "backend.h"
#include "state.h"
#include "util.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Workers' addresses: in host mode 127.0.1.1 .. 127.0.254.254, 254 hosts
 * on each of 254 subnets; in bridge mode the subnet's, at most as many
 * (network.h). */
#define IP_SLOTS (254 * 254)
#define LP_HASH 4096

/* One worker the backend knows: placed, started, or adopted. */
struct lproc {
  char id[16];
  int attempt;
  pid_t pid;                /* 0 until spawned */
  unsigned long long start; /* its start time, in clock ticks after boot */
  struct backend_req req;
  int ip_slot; /* -1: none */
  uint64_t gpu_mask;
  int live;           /* placed and not yet released */
  int adopted;        /* not our child: probed through /proc */
  int reported;       /* its end was reported: no second report */
  int exited;         /* our child, reaped: pid and start kept for its leftovers */
  int64_t kill_at_ms; /* a SIGKILL is due then; 0: none */
  struct lproc *hnext;
  struct lproc *next, *prev;
};

/* Work for the backend's thread. */
struct job {
  enum { JOB_START, JOB_CANCEL } kind;
  char id[16];
  char token[72];
  char controller_url[600];
  char account[64]; /* backend_start's: "" for --run-as */
  int attempt;
  struct backend_placement where;
  enum backend_cancel how;
  struct job *next;
};

/* The local backend's one state (defined in local_table.c). */
struct local_backend {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int running, stop;
  struct ctl_config cfg;
  /* Under mu: */
  struct lproc *hash[LP_HASH];
  struct lproc *head;
  struct job *jobs, *jobs_tail;
  unsigned char ip_used[IP_SLOTS];
  int ip_next; /* round-robin, so that an address is not reused at once */
  double cpu_used, memory_used;
  uint64_t gpu_used;
  /* The backend thread's own: */
  char **base_env;
  size_t base_env_len;
  char host_dir_env[600]; /* MUSTER_HOST_DIR: where its workerds beat together */
  int zygote_fd;
  pid_t zygote_pid;
  int64_t zygote_retry_ms;
  int zygote_spent; /* it answered that it can no longer fork */
  int64_t last_probe_ms;
  int room_freed; /* under mu: a record that held an address or GPUs went */
  int sweep;      /* under mu: reconciled; cgroups no worker owns can go */
};

extern struct local_backend lb;

/* A signal due to one worker's processes. */
struct sigjob {
  pid_t pid;                /* its workerd, the leader of its session */
  unsigned long long start; /* that workerd's start time */
  int sig;
  enum sig_whose {
    SIG_CHILD,   /* our child, not reaped yet: the pid is ours whatever /proc says */
    SIG_REAPED,  /* our child, reaped: the pid may be anyone's now, never signalled */
    SIG_ADOPTED, /* not our child: signalled only while /proc shows its start time */
  } whose;
  int leader_gone; /* local_signal_workers()'s own: only the session's leftovers */
};

/* Whose pid p's is (lb.mu held), for a sigjob. */
static inline enum sig_whose lp_whose(const struct lproc *p) {
  return p->adopted ? SIG_ADOPTED : p->exited ? SIG_REAPED : SIG_CHILD;
}

/* The settings one workerd is started with. */
#define WVARS 10
struct wvars {
  char url[640], id[64], token[128], ip[64], attempt[48], log[1200], logpath[1100];
  char cgroup[4200]; /* MUSTER_CGROUP: the cgroup directories workerd joins, one a line */
  char confine[600]; /* MUSTER_CONFINE: the directory the command must not see */
  char run_as[96];   /* MUSTER_RUN_AS: the account the commands run as */
  char netns[96];    /* MUSTER_NETNS: the bridge its network namespace joins */
  const char *v[WVARS];
};

/* Reports a worker attempt's failure (ev, with why) to the state machine.
 * Never call it with lb.mu held. */
static inline void report_fail(enum backend_event ev, const char *id, int attempt,
                               const char *why) {
  struct backend_report r = {.event = ev, .id = id, .attempt = attempt, .detail = why};

  backend_report(&r);
}

/* ---- local_table.c: the records (lb.mu held) ---- */

/* The record of worker id, or NULL. Borrowed: it lives until lp_free(). */
struct lproc *lp_find(const char *id);
/* A new record for id (ip_slot -1, nothing reserved), or NULL when out of
 * memory. It is lb's: lp_free() frees it. */
struct lproc *lp_new(const char *id);
/* Frees p and gives back the address and GPUs it held. */
void lp_free(struct lproc *p);
/* Frees p if nothing is left to do for it (see its definition). */
void lp_maybe_free(struct lproc *p);
/* Counts p's cores, memory and GPUs as used; p becomes live. */
void local_reserve(struct lproc *p);
/* A worker attempt's cgroup name, "ID.ATTEMPT", into buf. */
void local_cg_name(const char *id, int attempt, char *buf, size_t size);
/* The address slot of a worker's address ("127.0.A.B", or the bridge's
 * subnet's), or -1. */
MUST_CHECK int local_ip_to_slot(const char *ip);
/* The GPU mask of a list such as "0,1". */
uint64_t local_gpus_parse(const char *s);

/* ---- local_table.c: the operations on room (they take lb.mu) ---- */

int local_could_ever_fit(const struct backend_req *r, const char **field, char *msg, size_t msglen);
/* backend_ops.capacity: the host's cores, memory, GPUs and addresses. */
int local_capacity(struct backend_capacity *cap);
int local_place(const char *id, const struct backend_req *r, struct backend_placement *where,
                char *why, size_t whylen);
void local_release(const char *id);
void local_usage(double *cpu_used, double *cpu_total, double *mem_used, double *mem_total);

/* ---- local_signal.c ---- */

/* 1 if the process recorded as (pid, start) still runs. */
int local_proc_same(pid_t pid, unsigned long long start);
/* Signals each worker of jobs (n of them; reorders jobs) as a whole
 * session; see the definition. Takes no lock. */
void local_signal_workers(struct sigjob *jobs, int n);
/* The same for one worker. */
void local_signal_worker(pid_t pid, unsigned long long start, enum sig_whose whose, int sig);

/* ---- local_zygote.c (the backend's thread) ---- */

/* Starts the fork server, unless it is closed for good (or tried again
 * too recently), once no request is left unanswered: one that said it can
 * no longer fork is closed for good first. On failure workers are spawned
 * directly. */
void local_zygote_ensure(void);
/* Starts the fork server; on failure workers are spawned directly. */
void local_zygote_start(void);
/* Closes the fork server (and kills it); it is tried again 10 s on. */
void local_zygote_close(void);
/* Sends w's request to the fork server. Returns 0, or an error. */
MUST_CHECK int local_zygote_send(const struct wvars *w);
/* Reads the fork server's next answer: 0 with *pid set, MUSTER_E_BACKEND
 * (nothing started) or MUSTER_E_PROTOCOL (unknown whether it started). */
MUST_CHECK int local_zygote_recv(pid_t *pid);
/* Starts one workerd without the fork server. Returns 0 with *pid set, or
 * an error with a sentence in err. */
MUST_CHECK int local_spawn_direct(const struct wvars *w, pid_t *pid, char *err, size_t errlen);

/* ---- local_spawn.c (the backend's thread) ---- */

/* Starts the workerds of n start jobs (jobs[i] may be set to NULL; the
 * caller still owns and frees the jobs). Reports STARTED or REFUSED for
 * each. */
void local_start_batch(struct job **jobs, int n);

/* ---- local_sample.c (the backend's thread) ---- */

/* Fills u (id and attempt set) from its cgroup. Returns 0, or -1. */
int local_usage_read(struct backend_usage *u);
/* Samples running workers' usage, at most once a second. */
void local_sample_usage(int64_t now);

/* ---- local_reap.c (the backend's thread) ---- */

/* A worker attempt's processes ended: final usage, then its cgroup goes. */
void local_cg_finish(const char *id, int attempt);
/* Sends the SIGKILLs due by now (all of them when all is set). */
void local_kills_due(int64_t now, int all);
/* Reaps exited children and reports the workers' ends not yet reported. */
void local_reap(void);

/* ---- local_adopt.c ---- */

/* Reports adopted workers whose workerd is gone (at most once a second). */
void local_probe_adopted(int64_t now);
/* Removes cgroups no worker record owns (every 5 s, once reconciled). */
void local_sweep_cgroups(int64_t now);
/* The reconcile operation (backend.h). May block; before anything starts. */
int local_reconcile(struct backend_live *ws, int n, char *err, size_t errlen);

#endif
