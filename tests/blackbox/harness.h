/*
 * harness.h: black-box test helpers. They start the real muster-controller
 * (and through it real muster-workerd processes) on a free loopback port,
 * talk to it over HTTP with libcurl, and clean up only what they started,
 * by pid, even when an assertion fails or Check's timeout kills the test
 * (harness_cleanup.h).
 */
#ifndef MUSTER_HARNESS_H
#define MUSTER_HARNESS_H

#include <curl/curl.h>
#include <jansson.h>
#include <sys/types.h>

struct ctl_proc {
  pid_t pid;
  int port;
  char dir[96];
  char url[64];
  char token[96];
  char log[160];
  /* The workers' directory where a launch names none (the controller's
   * --workdir, DIR.work, writable by every account): workers write only
   * there, in their home and in their private /tmp. */
  char work[112];
  const char *extra[16];      /* extra controller arguments, NULL-terminated */
  const char *orphan_timeout; /* its workerds' MUSTER_ORPHAN_TIMEOUT (NULL: 60) */
  const char *bin;            /* the controller's binary (NULL: the build's) */
  uid_t uid;                  /* not 0: the controller runs as this account ... */
  gid_t gid;                  /* ... and group, owning its state directory */
  char subnet[24];            /* its workers' subnet (h_subnet()), its own */
  int tls;                    /* serve HTTPS: a throwaway CA's certificate (tests/tls) */
  char tls_dir[128];          /* ...in DIR.tls: ca.pem (MUSTER_CA_FILE), cert.pem, key.pem */
};

/* The workers' subnet the harness gives a controller on port (so that
 * test suites that run at once never share a bridge): a /24 in
 * 10.128.0.0/9 from the port's low 15 bits. */
void h_subnet(int port, char *buf, size_t len);

/* Makes curl trust c's test CA, when c serves HTTPS. */
void h_curl_tls(struct ctl_proc *c, CURL *curl);

/* Removes the bridge of c's subnet, if there is one (a test removes what
 * it made; a controller leaves its bridge, as docker leaves docker0). */
void h_bridge_remove(struct ctl_proc *c);

/* 1 if the bridge of subnet (a controller's --subnet) is there. */
int h_bridge_there(const char *subnet);

/* Starts a controller with a fresh state directory (or c->dir if set) on
 * c->port (a free one if 0) and waits until /api/v1/health answers (10 s at
 * most). Fails the test on error. */
void h_start(struct ctl_proc *c);

/* Launches body (one worker), awaits its end (60 s at most) and returns
 * its log (stream: "stdout", or NULL for both), malloc'ed; fails the test
 * unless the worker succeeded. */
char *h_output_of(struct ctl_proc *c, const char *body, const char *stream);

/* text as a JSON string (malloc'ed). */
char *h_json_text(const char *text);

/* A loopback port free now (for a test that must name it before a start). */
int h_free_port(void);

/* Restarts a controller on the same port and state directory. */
void h_restart(struct ctl_proc *c);

/* kill -9 of the controller (its workers keep running). */
void h_kill9(struct ctl_proc *c);

/* Kills every worker process the controller started (the pids they registered),
 * stops the controller and removes its state directory. */
void h_finish(struct ctl_proc *c);

/* A muster_exec_opts output callback that appends to arg, a NUL-terminated
 * buffer of H_COLLECT_MAX bytes (what does not fit is dropped). */
#define H_COLLECT_MAX 4096
int h_collect(void *arg, const char *data, size_t len);

/* One HTTP call. token NULL sends no Authorization header; "" sends the
 * controller's token. Returns the status; *out (if given) gets the parsed
 * JSON answer (new reference, NULL if not JSON), *raw (if given) the body
 * (malloc'ed). */
long h_http(struct ctl_proc *c, const char *method, const char *path, const char *body,
            const char *token, json_t **out, char **raw);

/* Launches with body, asserts 201, returns the new reference to the
 * workers array. */
json_t *h_launch(struct ctl_proc *c, const char *body);

/* POST /workers/await for every worker of arr; returns the answer. */
json_t *h_await(struct ctl_proc *c, json_t *workers, int wait_for_completion, double timeout);

/* The worker object of id (new reference). */
json_t *h_worker(struct ctl_proc *c, const char *id);

/* Waits up to timeout_s for worker id to reach status; returns it (new ref). */
json_t *h_wait_status(struct ctl_proc *c, const char *id, const char *status, double timeout_s);

/* Reads GET /api/v1/events?since=since until it holds want events or
 * timeout_ms passes. Returns the number of events read; *raw gets the text
 * (malloc'ed). */
int h_sse(struct ctl_proc *c, long since, int want, long timeout_ms, char **raw);

/* The pid that worker id's muster-workerd registered with (read from the
 * database; fails the test if there is none). */
long h_workerd_pid(struct ctl_proc *c, const char *id);

/* Waits up to timeout_s for the controller to exit by itself (a fault
 * point's abort); returns 1 if it did. */
int h_wait_exit(struct ctl_proc *c, double timeout_s);

/* The value of an unlabelled metric in GET /metrics. */
double h_metric(struct ctl_proc *c, const char *name);

/* Monotonic seconds. */
double h_now(void);

/* Seconds since the epoch: the clock of the API's times. */
double h_wall(void);

/* Seconds since the epoch of an API time ("2026-11-24T05:15:51.123Z"), or 0. */
double h_iso_seconds(const char *t);

/* Waits (timeout_s at most) until worker id has a heartbeat stored later
 * than after (seconds since the epoch), failing the test if it is anything
 * but running meanwhile, or if none comes. */
void h_wait_beat_after(struct ctl_proc *c, const char *id, double after, double timeout_s);

/* Waits up to timeout_s for process pid to be gone (or a zombie: it runs
 * no more, and /proc tells a zombie apart from a live process); returns 1
 * if it is, 0 if it still runs. */
int h_gone(long pid, double timeout_s);
/* The fields of /proc/PID/stat after the process's name (the state first)
 * in buf, or NULL when the process is gone. */
const char *h_proc_stat(long pid, char *buf, size_t len);

/* Writes an executable file (a fake workerd or a script) and returns its
 * path (static buffer per call site is the caller's). */
void h_write_exec(const char *path, const char *text);

const char *h_str(json_t *obj, const char *key);

/* Makes a directory /var/tmp/muster-TAG-XXXXXX (into dir, len bytes) that
 * the test and a worker share: workers' code runs as another account
 * (muster-worker), so it is open to every account (0777). The test removes
 * it, with what the worker left there, through h_shared_dir_remove. */
void h_shared_dir(char *dir, size_t len, const char *tag);
void h_shared_dir_remove(const char *dir);

/* Worker id's own token, as its workerd holds it (read from c's database),
 * into auth. */
void h_worker_token(struct ctl_proc *c, const char *id, char *auth, size_t len);
/* POSTs worker id's own call `what` (register, heartbeat) with its token
 * and body, as its workerd would; returns the answer (new reference) after
 * checking that it is a 200. */
json_t *h_worker_call(struct ctl_proc *c, const char *id, const char *what, const char *body);

/* Starts a shell command (from fmt) in the background: a client of the
 * controller under test. Returns its pid, to wait for or kill. */
pid_t h_sh_bg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
