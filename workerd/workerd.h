/*
 * workerd.h: muster-workerd's internal header: its limits, the types more
 * than one module uses, the daemon's one state (wd), and what each module
 * offers the others. main.c has the overall description; the modules:
 *
 *   main.c         main(), the main loop and its phases, stopping,
 *                  cleanup: the one module that drives the others
 *   wd_state.c     the daemon's one state, wd
 *   config.c       the configuration, from the environment
 *   signals.c      signals, turned into bytes on a self-pipe
 *   ctl_call.c     calls to the controller, non-blocking, a slot each
 *   http_client.c  HTTP/1.1 over TCP or GnuTLS, driven by the main loop
 *   http_target.c  the controller's URL, addresses and TLS authorities
 *   http_answer.c  reading an answer: status, framing, body
 *   client.c       the controller client: backoff, registration, heartbeats
 *   hostbeat.c     liveness per host: one workerd beats for its host's others
 *   report.c       the end: the last logs, then the exit report
 *   logship.c      the command's output: ring buffers, shipped as logs
 *   child.c        starting children (the worker's command and exec commands)
 *   exec_server.c  the exec channel's server (docs/exec-protocol.md); its
 *                  parts are in exec_internal.h
 *   zygote.c       the fork server (--zygote) of the controller's local backend
 *   run_account.c  the account commands run as, looked up and kept a while
 *
 * What a module keeps to itself stays static there; only what crosses
 * modules is declared here. Calls between modules go one way: main.c calls
 * the others and none calls main.c; wd_state.c calls nothing.
 */
#ifndef MUSTER_WORKERD_H
#define MUSTER_WORKERD_H

#include "http_client.h"
#include "scratch.h"
#include "session_name.h"
#include "util.h"

#include <jansson.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef MUSTER_VERSION
#define MUSTER_VERSION "dev"
#endif

/* ------------------------------------------------------------------------ */
/* Limits and timings                                                       */

#define WD_URL_MAX 2048                    /* MUSTER_CONTROLLER_URL */
#define WD_ID_MAX 64                       /* MUSTER_WORKER_ID */
#define WD_TOKEN_MAX 512                   /* MUSTER_WORKER_TOKEN */
#define WD_IP_MAX 64                       /* an IPv6 address with a zone fits */
#define WD_ANSWER_MAX (1u << 20)           /* largest answer body we accept */
#define WD_ARGV_MAX 4096                   /* most arguments in "command" */
#define WD_ENV_MAX 4096                    /* most variables in "env" */
#define WD_REASON_MAX 512                  /* the exit report's "reason" */
#define WD_GROUPS_MAX 32                   /* supplementary groups of MUSTER_RUN_AS */
#define WD_STREAM_CAP (8u << 20)           /* unshipped bytes kept per stream */
#define WD_FLUSH_BYTES (64u << 10)         /* flush a stream once it holds this */
#define WD_FLUSH_DELAY_MS 200              /* ... or this long after its first byte */
#define WD_POST_MAX (512u << 10)           /* largest body of one logs POST */
#define WD_READS_PER_WAKE 16               /* reads per stream per poll round */
#define WD_RETRY_FIRST_MS 100              /* backoff: first delay ... */
#define WD_RETRY_MAX_MS 5000               /* ... doubling up to this ... */
#define WD_RETRY_TOTAL_MS (10 * 60 * 1000) /* ... for at most this long */
#define WD_KILL_GRACE_MS 5000              /* SIGTERM to SIGKILL */
#define WD_DRAIN_MS 2000                   /* reading pipes after the child exited */
#define WD_CALL_TIMEOUT_MS 10000L
#define WD_HEARTBEAT_DEFAULT_MS 2000

/* The exec server's size, which the main loop's pollfd array depends on. */
#define EX_CONN_MAX 64   /* concurrent authenticated connections (commands) */
#define EX_UNAUTH_MAX 16 /* connections whose hello's token is not yet checked */
#define EX_SPARE 16      /* more records, for refusals on their way */
#define EX_RECORDS (EX_CONN_MAX + EX_UNAUTH_MAX + EX_SPARE)
#define EX_POLL_MAX (EX_RECORDS * 4 + 1)

/* ------------------------------------------------------------------------ */
/* Shared types                                                             */

/* One call to the controller, made by a fixed slot (registration, heartbeat,
 * a log stream, the exit report): at most one in flight per slot, driven by
 * the main loop (ctl_call.c). The slot's owner starts it, and takes it once
 * it is CALL_DONE. */
enum call_state { CALL_IDLE, CALL_RUNNING, CALL_DONE };
struct call {
  enum call_state state;
  bool ready;    /* registered with ctl_call.c, at the slot's first call */
  struct hc hc;  /* its connection, kept for the slot's life */
  char what[64]; /* the URL's last part, for the logs */
  char *answer;  /* CALL_DONE: the answer's body (hc's), NUL-terminated, or NULL */
  size_t answer_len;
  int rc;      /* CALL_DONE: 0 or MUSTER_E_* (call_take()) */
  long status; /* CALL_DONE with rc 0: the HTTP status */
  int64_t started_ms;
};

/* One output stream of the worker (its command's, and the exec channel's
 * commands'): a ring buffer of the bytes that the controller has not
 * accepted yet. The ring is allocated once, at its full capacity; untouched
 * pages cost no memory, and the read position returns to the start whenever
 * the ring empties, so a worker whose logs flow normally only ever touches
 * its first pages. */
struct stream {
  const char *name; /* "stdout" or "stderr", as in the logs URL */
  int fd;           /* read end of the pipe; -1 once at EOF, or never opened */
  char *ring;       /* WD_STREAM_CAP bytes; NULL until stream_open() */
  size_t start;     /* offset of the oldest byte */
  size_t len;       /* bytes held */
  uint64_t dropped; /* bytes overwritten and not yet told in a notice */
  int64_t first_ms; /* when the oldest held byte arrived; valid if len > 0 */
  /* Shipping: the POST in flight carries a copy of the ring's first
   * sent bytes (in send); while it flies, a full ring may drop some of them,
   * which leaves inflight of them still held at the ring's start. A notice
   * in flight carries notice_n dropped bytes instead. */
  struct call call;
  char *send; /* WD_POST_MAX bytes, allocated at the first POST */
  size_t sent, inflight;
  uint64_t notice_n;
  char notice[128];
  uint64_t post_appended; /* appended when the POST in flight started */
  uint64_t appended;      /* bytes ever appended ... */
  uint64_t settled;       /* ... and ever taken by the controller, refused or dropped */
};

/* How the worker ends, decided by the first reason to stop. */
enum finish_mode {
  FINISH_REPORT, /* flush logs and report the exit, retrying for 10 minutes or
                    MUSTER_ORPHAN_TIMEOUT if longer (or until the stop grace, when a
                    signal stops the worker) */
  FINISH_QUIET,  /* the controller asked us to stop: one last flush and one try at the
                    report (it says the output is all in) */
  FINISH_SILENT  /* the controller no longer knows us: say nothing more */
};

/* Where the child failed before the command started, sent to the parent
 * through a close-on-exec pipe (end of file there means exec succeeded). */
enum exec_stage {
  STAGE_SETUP = 1,
  STAGE_CHDIR = 2,
  STAGE_EXEC = 3,
  STAGE_CONFINE = 4,
  STAGE_SCRIPT = 5, /* the script the kernel would run is not there */
  STAGE_USER = 6,   /* could not become the worker's account */
  STAGE_PATH = 7    /* the account sees no such program (on its PATH, or at the path) */
};
struct exec_status {
  int stage;
  int err;
};

/* What a child runs, prepared entirely before fork(): argv and envp are
 * NULL-terminated; cwd may be NULL (stay where workerd is). */
struct child_spec {
  int in_fd, out_fd, err_fd; /* become the command's fds 0, 1 and 2 */
  int status_fd;             /* close-on-exec pipe for a struct exec_status */
  char *const *argv;
  char **envp;
  const char *cwd;
  const char *script; /* checked to exist (after cwd) before exec, or NULL */
  bool own_group;     /* exec commands: own process group, killed with workerd */
  /* The worker's command under the local backend's isolation: its own mount
   * and PID namespaces, this directory (the controller's state) hidden, the
   * capabilities a container would not have dropped. NULL: none. */
  const char *confine;
  char uid_map[32], gid_map[32]; /* confine, not as root: the user namespace's maps */
  char user_sockets[4][64];      /* confine: the user's own buses and engines, blocked */
  /* confine: bound over /tmp, the rest of the host read-only but cwd and
   * home; NULL: neither (the host's /tmp, writable where permitted) */
  const char *scratch, *home;
  pid_t parent; /* with own_group: workerd's pid, taken before fork() */
  /* The account the command runs as (MUSTER_RUN_AS), after the isolation:
   * supplementary groups none, no new privileges. run_uid 0: stay. */
  uid_t run_uid;
  gid_t run_gid;
  const gid_t *run_groups; /* its supplementary groups (n_run_groups of them) */
  int n_run_groups;
};

/* Delays between attempts of a call that must eventually get through. */
struct backoff {
  int64_t give_up_ms;
  int64_t delay_ms;
};

/* ------------------------------------------------------------------------ */
/* The daemon's one state (defined in wd_state.c)                           */

/* In the manner of Redis's `server`. The exec server's own state (its
 * connections) is exec_server.c's. */
struct wd_state {
  /* Configuration, from the environment. */
  char url[WD_URL_MAX + 1];
  char id[WD_ID_MAX + 1];
  char token[WD_TOKEN_MAX + 1];
  bool token_missing; /* MUSTER_WORKER_TOKEN_FD gave none: exit WD_EXIT_NO_TOKEN */
  bool rotate;        /* the token travelled (MUSTER_WORKER_TOKEN_FD): register trades it */
  char ip[WD_IP_MAX];
  char confine[1024];     /* MUSTER_CONFINE: the directory to hide ("": no confinement) */
  char run_as[64];        /* MUSTER_RUN_AS: the account commands run as ("": workerd's own) */
  char home[1024];        /* its home (or workerd's own): writable where confined */
  struct scratch scratch; /* confined: the session's private /tmp, held (lock_fd >= 0) */
  char session[SESSION_STORED_MAX];
  uid_t run_uid;
  gid_t run_gid;
  gid_t run_groups[WD_GROUPS_MAX]; /* its own groups, less the privileged ones */
  int n_run_groups;
  long attempt; /* the start attempt the backend started this workerd for */
  int exec_port;
  int listen_fd;
  int sig_read_fd;

  /* The controller, as the last call found it (ctl_call.c). */
  bool controller_up;
  int64_t last_contact_ms; /* when the controller last answered (not a 5xx) */
  int64_t away_since_ms;   /* 0, or since when the calls get no answer (or a
                            * 5xx): the orphan timeout runs from it */
  int64_t orphan_ms;       /* give up after this long without an answer */

  /* What register assigned. argv and envp are NULL-terminated, owned here. */
  int64_t hb_interval_ms;
  bool host_beat;     /* the last answer said to beat with this host's others */
  char host_group[9]; /* whose: the register answer's host_beat_group (hex) */
  char **argv;
  size_t argc;
  char **envp;
  char *cwd;
  char *script;     /* the script's absolute path, checked before exec; or NULL */
  char *exec_token; /* a secret: never logged; NULL = exec refused */

  /* The command and how it ended. */
  pid_t child;
  bool child_done;
  int wait_status;
  int64_t drain_until_ms;
  char reason[WD_REASON_MAX]; /* empty unless the command could not start */
  /* The memory cgroup's out-of-memory kills when the command started
   * (cgroup_mem.h), or -1 when there is no cgroup to read. */
  long long oom_kills_at_start;
  bool exec_started; /* an exec command ran (it shares the cgroup's count) */
  struct stream out;
  struct stream err;

  /* Stopping. */
  bool stopping; /* a stop was decided; mode says how to end */
  bool finish;   /* leave the main loop now (idle worker, failed start) */
  bool ending;   /* the main loop is winding down the exec channel to leave */
  enum finish_mode mode;
  int stop_signal;    /* SIGTERM or SIGINT if that is why we stop, else 0 */
  int term_received;  /* SIGTERM or SIGINT came, whether or not it started the stop */
  int64_t term_at_ms; /* when the first of them came */
  int64_t kill_at_ms; /* when to send SIGKILL; INT64_MAX once sent */

  /* Deadlines of the main loop. */
  int64_t next_hb_ms;
  int64_t logs_retry_at_ms;
  int64_t logs_backoff_ms;
  int64_t logs_failed_ms; /* when the last log POST that failed had started */
};

extern struct wd_state wd;

/* ------------------------------------------------------------------------ */
/* config.c: the configuration                                              */

/* Sets the log level from MUSTER_LOG_LEVEL, if it is set to a known name. */
void log_level_from_env(void);
/* Reads and checks the configuration from the environment into wd.
 * Returns 0 or MUSTER_E_INVALID (logged). */
MUST_CHECK int config_load(void);

/* ------------------------------------------------------------------------ */
/* run_account.c: the account a worker's commands run as                    */

struct run_account {
  char name[sizeof(((struct wd_state *)0)->run_as)];
  uid_t uid;
  gid_t gid;
  char home[sizeof(((struct wd_state *)0)->home)];
  bool home_too_long;          /* its home does not fit in home: refused */
  gid_t groups[WD_GROUPS_MAX]; /* its supplementary groups, less the privileged */
  int n_groups;
  bool too_many_groups; /* in more than WD_GROUPS_MAX: given none */
  bool keep;            /* every group's entry was read: may be kept */
};

/* Fills *a with account name from the name service. Returns 0, or -1 if
 * there is no such account (or the name does not fit). */
MUST_CHECK int run_account_ask(const char *name, struct run_account *a);
/* Fills *a with what this process (or the fork server it was forked
 * from) kept for account name in the last few seconds. Returns 0, or -1
 * if nothing fresh is kept. */
MUST_CHECK int run_account_cached(const char *name, struct run_account *a);
/* Keeps *a, asked of the name service at asked_ms (util_mono_ms()),
 * unless its a->keep says not to. */
void run_account_store(const struct run_account *a, int64_t asked_ms);
/* run_account_cached(), else run_account_ask() and run_account_store(). */
MUST_CHECK int run_account_lookup(const char *name, struct run_account *a);

/* ------------------------------------------------------------------------ */
/* signals.c: the self-pipe                                                 */

/* Creates the self-pipe (wd.sig_read_fd) and installs the handlers.
 * Returns 0 or MUSTER_E_IO (logged). */
MUST_CHECK int signals_install(void);
/* Empties the self-pipe: *child if SIGCHLD arrived, *term SIGTERM or SIGINT
 * if one of them did. */
void signals_take(bool *child, int *term);

/* ------------------------------------------------------------------------ */
/* ctl_call.c: calls to the controller, never blocking                      */

/* Room the main loop's pollfd array keeps for calls_poll_add(). */
#define CALL_POLL_MAX 16

MUST_CHECK int calls_init(void);
/* Replaces the bearer token of every later call (register's new one). */
MUST_CHECK int calls_set_token(const char *tok);
void calls_cleanup(void);
/* Past this heartbeat interval, no connection is kept from one heartbeat
 * to the next, nor longer than CALL_KEEP_IDLE_MS after its call (a log
 * POST's): 100,000 workers beating every 20 s would otherwise hold 100,000
 * of the controller's connections. */
#define CALL_KEEP_INTERVAL_MS 10000
#define CALL_KEEP_IDLE_MS 2000
/* Closes the connections kept between calls, when the heartbeat interval
 * is longer than CALL_KEEP_INTERVAL_MS (after a register or a heartbeat). */
void calls_keep_none(void);
MUST_CHECK int call_start(struct call *c, const char *suffix, bool json, const void *body,
                          size_t len, int64_t timeout_ms);
void call_cancel(struct call *c);
MUST_CHECK int call_take(struct call *c, long *status);
bool call_unanswered(int rc, long status);
void calls_poll_add(struct pollfd *p, int *n);
int64_t calls_next_deadline(void);
void calls_poll_handle(const struct pollfd *p, int64_t now);

/* ------------------------------------------------------------------------ */
/* client.c: the controller client                                          */

/* What a step of the registration or a heartbeat's answer decides. */
enum reg_result { REG_BUSY, REG_OK, REG_FAILED };
enum hb_result { HB_NONE, HB_STOP_QUIET, HB_STOP_SILENT };

MUST_CHECK int ip_toward_controller(char *ip, size_t size);
void backoff_init(struct backoff *b);
MUST_CHECK int backoff_wait(struct backoff *b);
int64_t backoff_next(struct backoff *b, int64_t now);
MUST_CHECK int register_begin(void);
enum reg_result register_step(int64_t now, int *rc);
int64_t register_deadline(void);
void register_cancel(void);
enum hb_result hb_step(int64_t now);
void hb_cancel(void);

/* ------------------------------------------------------------------------ */
/* hostbeat.c: liveness per host                                            */

/* Joins or leaves the host's heartbeat as wd.host_beat says, touches this
 * worker's beacon (which says refused, its exec refusals: ex_refused()),
 * takes the agent's part if nobody has it, and reads what the agent last
 * said for this worker. Returns HB_NONE (the agent's word is no stop).
 * Never waits. */
enum hb_result host_beat_step(int64_t now, uint64_t refused);
/* Whether the agent answers for this worker now: its own beat is skipped. */
bool host_beat_covered(int64_t now);
/* Until when it does (0: not covered). */
int64_t host_beat_covered_until(void);
/* When host_beat_step() must next run (INT64_MAX: not joined). */
int64_t host_beat_deadline(void);
/* The agent's: the siblings its next heartbeat speaks for, as its body's
 * "vouch" (a new reference), or NULL when it is not the agent or there is
 * none. */
json_t *host_beat_vouch(void);
/* The agent's: writes each sibling's ack from its heartbeat's answer
 * ("vouched", borrowed). */
void host_beat_answered(const json_t *vouched);
/* Leaves the host's heartbeat: its beacon and ack removed, the agent's lock
 * given up. */
void host_beat_leave(void);
/* The open descriptor of the host's lock (-1: none), for a child to close. */
int host_beat_lock_fd(void);

/* ------------------------------------------------------------------------ */
/* logship.c: the worker's output, shipped as logs                          */

MUST_CHECK int stream_open(struct stream *s);
void stream_append(struct stream *s, const char *data, size_t n, int64_t now);
void stream_read(struct stream *s, int64_t now);
int64_t streams_deadline(void);
void streams_ship(int64_t now, bool all);
void streams_take(int64_t now);
bool streams_idle(void);
void streams_cancel(void);
void streams_mark(uint64_t mark[2]);
bool streams_shipped(const uint64_t mark[2]);
void streams_ship_soon(const uint64_t mark[2]);

/* ------------------------------------------------------------------------ */
/* report.c: the end                                                        */

enum report_result { REPORT_BUSY, REPORT_DONE, REPORT_GAVE_UP };

MUST_CHECK int report_begin(int64_t now);
void report_signal(int64_t now);
enum report_result report_step(int64_t now);
int64_t report_deadline(void);
void report_cleanup(void);

/* ------------------------------------------------------------------------ */
/* child.c: children, and small helpers every module uses                   */

void fd_close(int *fd);
/* Closes both ends of a pipe (either may be -1 already). */
void fd_close_pair(int p[2]);
void strv_free(char **v);
void child_spec_worker(struct child_spec *cs);
/* Confined: makes or joins the session's private /tmp (scratch.h), once
 * registered. Returns 0, or -1 with wd.reason said. */
MUST_CHECK int worker_scratch_enter(void);
void worker_scratch_leave(void);
pid_t child_spawn(const struct child_spec *cs);
bool child_exec_failed(int status_fd, struct exec_status *st);
void child_failure_sentence(const struct exec_status *st, const char *cwd, const char *script,
                            char *const *argv, char *const *envp, char *buf, size_t size);
MUST_CHECK int command_start(void);
void child_reap(int64_t now);

/* ------------------------------------------------------------------------ */
/* sandbox.c: a confined command's mounts and capabilities (in the child)   */

/* The namespaces (flags: CLONE_NEWNS, and CLONE_NEWPID for the worker's
 * command; a user namespace when not root) and the mounts of cs. Returns 0,
 * or -1 with errno set. */
int confine_mounts(const struct child_spec *cs, int flags);
/* The capabilities a confined command keeps, none inherited past exec, no
 * new privileges. Returns 0, or -1 with errno set. */
int confine_caps(void);
/* Makes path (if it exists) read-only here, keeping its other flags. */
int confine_read_only(const char *path);

/* ------------------------------------------------------------------------ */
/* exec_server.c: the exec channel                                          */

/* Makes what every worker's exec channel needs and none changes (its TLS
 * credentials and priorities), once, in the fork server: its workers
 * inherit them instead of each making its own. */
void exec_prewarm(void);
MUST_CHECK int exec_listen(void);
void ex_stop_all(int64_t now);
bool ex_stopping(void);
/* Exec connections refused before their token held, since start (each
 * heartbeat carries it: the controller's muster_exec_refused_total). */
uint64_t ex_refused(void);
bool ex_done(int64_t now);
void ex_reap(int64_t now);
int64_t ex_next_deadline(void);
void ex_poll_add(struct pollfd *p, int *n, int64_t now);
void ex_poll_handle(const struct pollfd *p, int64_t now);
void ex_cleanup(void);

/* ------------------------------------------------------------------------ */
/* zygote.c: the fork server                                                */

/* Serves the fork server on ZYGOTE_FD; each worker it forks returns
 * run_worker() as its exit code (main.c passes the worker's main). */
int zygote_main(int (*run_worker)(void));
/* Run first by muster-workerd --zygote (argv its own): runs itself again
 * with LD_BIND_NOW=1 (and a mark that it set it), so that every symbol of
 * every library is bound once, here, and no worker forked from it looks
 * one up again (nor copies the page it would write the answer to); run
 * again, takes both out, so that no worker's command inherits them. An
 * LD_BIND_NOW it was started with is left as it is. */
void zygote_rebind(char **argv);

/* ---- netns.c ---- */

/* The local backend's bridge mode: when MUSTER_NETNS ("BRIDGE
 * GATEWAY/PREFIX") is set, moves this process into a network namespace of
 * its own, plugged into that bridge with address MUSTER_BIND_IP and a
 * default route through the gateway. Root only; before any thread starts.
 * Returns 0 (also when unset), or -1 (said on stderr). */
int wd_netns_enter(void);

/* ---- job.c ---- */

/* muster-workerd --job SCRIPT: a Slurm job's first process. Claims the
 * tokens of the workers SCRIPT names with MUSTER_JOB_SECRET and starts
 * their steps (srun, then workerd, at path workerd), each given its token
 * on stdin; waits for them. Returns the exit code. */
int job_main(const char *script, const char *workerd);
/* dumpable: PR_GET_DUMPABLE at main's entry. 0, or -1 (said on stderr)
 * when it was 1 in a job a root controller submitted as another account
 * (MUSTER_JOB_ACCOUNT): this binary is readable by that account, so the
 * job's secret and tokens were open to it until main's first line. */
int job_check_dumpable(int dumpable);
/* A Slurm step's workerd that got no token on its stdin exits with this
 * (srun passes it on): its launcher tells the controller, whose answer
 * fails the worker (another process read the token first). */
#define WD_EXIT_NO_TOKEN 75

#endif
