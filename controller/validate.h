/*
 * validate.h: checks of REST request bodies, before anything is stored.
 *
 * Each function fills *field with the name of the offending field (a static
 * string) and msg with a sentence naming it, and returns MUSTER_E_INVALID
 * (422), MUSTER_E_MALFORMED (400) or MUSTER_E_CAPACITY (422).
 */
#ifndef MUSTER_VALIDATE_H
#define MUSTER_VALIDATE_H

#include <jansson.h>
#include <stddef.h>

#define LAUNCH_MAX_N 1024
#define LAUNCH_MAX_CWD 4095   /* PATH_MAX less its NUL */
#define LAUNCH_MAX_PATH 32768 /* a PATH of many conda and module directories */

/* A validated launch request; every pointer is borrowed from the body. */
struct launch_req {
  long n;
  double cpu, memory;
  int nvidia_gpu;
  const char *script, *code, *kernel, *role, *name, *session;
  const char *run;    /* the run the workers belong to, or NULL */
  const char *cwd;    /* an absolute directory, or NULL: the controller's --workdir */
  const char *path;   /* the PATH of the worker's commands, or NULL: the worker's own */
  json_t *command;    /* array of strings, or NULL */
  json_t *args;       /* array of strings, or NULL */
  json_t *env;        /* object of strings, or NULL */
  json_t *secret_env; /* object of strings, or NULL */
};

/* The first key of object body that is not one of known (n of them), or
 * NULL if there is none (borrowed from body). */
const char *validate_unknown_field(json_t *body, const char *const *known, size_t n);

int validate_launch(json_t *body, struct launch_req *out, const char **field, char *msg,
                    size_t msglen) __attribute__((warn_unused_result));

/* The argument a kernel needs before inline code ("-c", "-e"), or NULL if
 * the kernel is not known to take inline code. */
const char *validate_kernel_code_flag(const char *kernel);

/* A validated await request. ids is a new reference to an array of id
 * strings (worker objects reduced to their "id"). */
struct await_req {
  json_t *ids;
  int wait_for_completion;
  double timeout_seconds;
};

int validate_await(json_t *body, struct await_req *out, const char **field, char *msg,
                   size_t msglen) __attribute__((warn_unused_result));

/* A workerd's registration (POST /api/v1/workers/{id}/register). Fields it
 * may leave out, or that are out of range, come out as 0 / NULL: they are
 * its own account of itself, checked against what the controller knows. */
struct register_req {
  char ip_address[64];           /* an IPv4 or IPv6 address (required) */
  const char *hostname;          /* borrowed; NULL if absent or over 255 bytes */
  int exec_port;                 /* 1..65535, or 0 */
  int pid;                       /* 1..2^30 - 1, or 0 */
  unsigned long long start_time; /* the pid's start time (/proc), or 0 */
  int attempt;                   /* the start attempt it belongs to, or 0 */
  int rotate; /* "rotate": true: the answer carries a new token, the old one dies */
  /* "token_lost": true: a Slurm job's launcher says the worker's workerd
   * got no token (another process read it from srun's stdin) */
  int token_lost;
};

int validate_register(json_t *body, struct register_req *out, const char **field, char *msg,
                      size_t msglen) __attribute__((warn_unused_result));

/* A workerd's report of how the script ended (POST .../exit). failure is
 * the sentence the worker fails with, "" when it succeeded. */
struct exit_req {
  int exit_code; /* as reported (when has_exit_code) */
  int has_exit_code;
  int signal; /* 1..127, or 0 */
  char failure[1200];
};

int validate_exit(json_t *body, struct exit_req *out, const char **field, char *msg, size_t msglen)
    __attribute__((warn_unused_result));

/* 1 if s looks like a worker id: "w-" and 10 of [a-z0-9]. */
int validate_worker_id(const char *s);
/* 1 if s looks like a run id ("r-" and 10 of [a-z0-9]). */
int validate_run_id(const char *s);

/* 1 if s is a session, role or similar name: 1..64 of [A-Za-z0-9_.-]. */
int validate_name(const char *s);

#endif
