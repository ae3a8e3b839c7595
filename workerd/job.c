/*
 * job.c: muster-workerd --job SCRIPT, the first process of a Slurm job
 * muster submitted (the batch script's interpreter: controller/
 * slurm_script.c writes the script).
 *
 * No step of the job may read another's token, and every step runs as the
 * job's one account: anything in the job's script or environment, and the
 * memory of any dumpable process of that account, is open to all of them.
 * So the job carries one secret (MUSTER_JOB_SECRET, in its environment),
 * and this launcher, before any step exists:
 *   1. is non-dumpable from exec on (its /proc/PID/environ and mem are
 *      root's alone: muster-workerd is root-owned, mode 0711, and main()
 *      refuses to run a job otherwise) and takes the secret out of its
 *      environment;
 *   2. claims the workers' tokens with it (POST /api/v1/workers/{id}/claim,
 *      with a claim key of its own, picked at random; made again while the
 *      controller cannot be reached, or answers 5xx: the same claim with
 *      the same key gets the same tokens until a register trades one):
 *      the controller mints new tokens, so the secret is dead once claimed
 *      for anyone without the key, and a step that finds it gets nothing
 *      from it;
 *   3. starts one `srun ... muster-workerd` step per "#@" line of SCRIPT,
 *      handing that step's token through srun's stdin (a pipe), never
 *      through an environment or a command line; each workerd reads it
 *      from fd 0 (MUSTER_WORKER_TOKEN_FD=0) and is itself non-dumpable;
 *   4. waits for its steps, as the shell script before it did.
 * Calls nothing else of workerd; main.c calls job_main().
 */
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define JOB_MAX 1024          /* workers of one job */
#define JOB_CLAIM_MS 600000   /* the claim is retried this long while the controller is away */
#define JOB_ANSWER_MAX 262144 /* the claim's answer */

extern char **environ;

/* One "#@" line: a worker's step. */
struct job_step {
  char id[16];
  int attempt, het, cpus, gpus;
  long mem;
  char token[72]; /* from the claim ("": none; its step is not started) */
  pid_t pid;      /* its srun (0: none) */
};

/* What a POST received. */
struct job_buf {
  char *p; /* the answer's body (NUL-terminated) or NULL */
  size_t n;
  char err[HC_ERR_MAX]; /* why no answer came */
};

/* One POST of body to url + path with bearer's token, its answer into *b:
 * straight to the controller, as workers reach it (no proxy). Returns 0
 * (*code: the HTTP status) or MUSTER_E_* (b->err says why). */
static int job_post(const char *url, const char *path, const char *bearer, const char *body,
                    struct job_buf *b, long *code) {
  char hdr[200];
  struct hc_target to;
  int rc;

  *code = 0;
  if (hc_target_parse(url, &to) != 0) {
    snprintf(b->err, sizeof(b->err), "%s is not a valid http:// or https:// URL", url);
    return MUSTER_E_INVALID;
  }
  if ((size_t)snprintf(hdr, sizeof(hdr),
                       "Authorization: Bearer %s\r\nContent-Type: application/json\r\n",
                       bearer) >= sizeof(hdr)) {
    snprintf(b->err, sizeof(b->err), "the token is too long");
    explicit_bzero(hdr, sizeof(hdr));
    return MUSTER_E_INVALID;
  }
  rc = hc_post_wait(&to, path, hdr, body ? body : "", 30000, code, &b->p, &b->n, b->err,
                    sizeof(b->err));
  explicit_bzero(hdr, sizeof(hdr));
  if (rc == 0 && b->n > JOB_ANSWER_MAX) {
    snprintf(b->err, sizeof(b->err), "the answer is larger than %d bytes", JOB_ANSWER_MAX);
    rc = MUSTER_E_TOO_LARGE;
  }
  return rc;
}

/* Reads SCRIPT's "#@" lines into st (room for JOB_MAX). Returns their
 * number, or -1 (said on stderr). */
static int job_read_script(const char *path, struct job_step *st) {
  FILE *f = fopen(path, "re");
  char line[512];
  int n = 0;

  if (!f) {
    fprintf(stderr, "muster-workerd: error: cannot read the job's script %s: %s\n", path,
            strerror(errno));
    return -1;
  }
  while (fgets(line, sizeof(line), f)) {
    struct job_step *s = &st[n];

    if (strncmp(line, "#@ ", 3) != 0)
      continue;
    if (n == JOB_MAX || sscanf(line + 3, "%15s %d %d %d %ld %d", s->id, &s->attempt, &s->het,
                               &s->cpus, &s->mem, &s->gpus) != 6) {
      fprintf(stderr, "muster-workerd: error: the job's script has a bad step line: %s", line);
      fclose(f);
      return -1;
    }
    n++;
  }
  fclose(f);
  if (!n)
    fprintf(stderr, "muster-workerd: error: the job's script names no worker\n");
  return n ? n : -1;
}

/* Claims the tokens of st[0..n-1] with secret at url, into st[].token.
 * Retries while the controller cannot be reached or answers 5xx. Returns 0
 * or -1 (said on stderr). */
static int job_claim(const char *url, const char *secret, struct job_step *st, int n) {
  char path[700], key[65];
  json_t *body = json_object(), *ws = json_array(), *ans = NULL;
  int64_t until = util_mono_ms() + JOB_CLAIM_MS, wait_ms = 500;
  char *text;
  long code = 0;
  int rc = -1;

  /* (the claim key: this launcher's alone, in its non-dumpable memory and
   * in each try's body; the same claim made again with it, its answer
   * lost, gets the same tokens, and no other process that read the secret
   * can claim them) */
  if (util_random_hex(key, 32) != 0) {
    fprintf(stderr, "muster-workerd: error: no random bytes for the job's claim key\n");
    json_decref(body);
    json_decref(ws);
    return -1;
  }
  if (json_object_set_new(body, "claim_key", json_string(key)) != 0) {
    fprintf(stderr, "muster-workerd: error: out of memory for the job's claim\n");
    explicit_bzero(key, sizeof(key));
    json_decref(body);
    json_decref(ws);
    return -1;
  }
  json_object_set_new(body, "workers", ws);
  for (int i = 0; i < n; i++)
    json_array_append_new(ws, json_pack("{s:s, s:i}", "id", st[i].id, "attempt", st[i].attempt));
  text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/claim", st[0].id);
  for (;;) {
    struct job_buf b = {0};
    int cr;

    if (!text)
      break;
    cr = job_post(url, path, secret, text, &b, &code);
    if (cr == 0 && code == 200) {
      ans = json_loads(b.p ? b.p : "", 0, NULL);
      if (b.p)
        explicit_bzero(b.p, b.n);
      free(b.p);
      break;
    }
    if (cr == MUSTER_E_INVALID) {
      fprintf(stderr, "muster-workerd: error: %s\n", b.err);
      goto out;
    }
    if (cr == 0 && code < 500) {
      fprintf(stderr,
              "muster-workerd: error: the controller refused this job's claim of its workers "
              "(HTTP %ld): %.300s\n",
              code, b.p ? b.p : "");
      if (b.p)
        explicit_bzero(b.p, b.n);
      free(b.p);
      goto out;
    }
    if (b.p)
      explicit_bzero(b.p, b.n);
    free(b.p);
    if (util_mono_ms() >= until) {
      fprintf(stderr,
              "muster-workerd: error: the controller at %s could not be reached for %d "
              "minutes (%s)\n",
              url, JOB_CLAIM_MS / 60000, cr == 0 ? "HTTP 5xx" : b.err);
      goto out;
    }
    usleep((useconds_t)wait_ms * 1000);
    wait_ms = wait_ms * 2 > 10000 ? 10000 : wait_ms * 2;
  }
  {
    json_t *list = json_object_get(ans, "workers"), *e;
    size_t i;

    json_array_foreach(list, i, e) {
      const char *id = json_string_value(json_object_get(e, "id"));
      const char *tok = json_string_value(json_object_get(e, "token"));

      for (int k = 0; id && tok && strlen(tok) < sizeof(st[k].token) && k < n; k++)
        if (strcmp(st[k].id, id) == 0)
          snprintf(st[k].token, sizeof(st[k].token), "%s", tok);
    }
    rc = json_is_array(list) ? 0 : -1;
    if (rc)
      fprintf(stderr, "muster-workerd: error: the controller's answer to the claim has no "
                      "workers\n");
  }
out:
  json_decref(ans); /* (its strings held tokens: freed, as libc frees) */
  if (text)
    explicit_bzero(text, strlen(text));
  free(text);
  explicit_bzero(key, sizeof(key));
  return rc;
}

/* Starts step s: srun with its token on stdin (a pipe). Returns the pid,
 * or -1 (said on stderr). */
static pid_t job_start_step(const struct job_step *s, const char *workerd) {
  char cpus[32], mem[48], gpus[48], het[32], attempt[24];
  char *argv[24];
  int p[2], a = 0;
  pid_t pid;

  if (pipe2(p, O_CLOEXEC) != 0) {
    fprintf(stderr, "muster-workerd: error: pipe: %s\n", strerror(errno));
    return -1;
  }
  snprintf(cpus, sizeof(cpus), "%d", s->cpus);
  snprintf(mem, sizeof(mem), "--mem-per-cpu=%ld", s->mem);
  snprintf(gpus, sizeof(gpus), "--gpus-per-task=%d", s->gpus);
  snprintf(het, sizeof(het), "--het-group=%d", s->het);
  snprintf(attempt, sizeof(attempt), "%d", s->attempt);
  argv[a++] = "srun";
  if (s->het >= 0)
    argv[a++] = het;
  argv[a++] = "--exact";
  argv[a++] = "-n1";
  argv[a++] = "-N1";
  argv[a++] = "-c";
  argv[a++] = cpus;
  if (s->mem > 0)
    argv[a++] = mem;
  if (s->gpus > 0)
    argv[a++] = gpus;
  argv[a++] = "-J";
  argv[a++] = (char *)s->id;
  argv[a++] = (char *)workerd;
  argv[a] = NULL;
  pid = fork();
  if (pid == 0) {
    if (dup2(p[0], 0) < 0 || setenv("MUSTER_WORKER_ID", s->id, 1) != 0 ||
        setenv("MUSTER_WORKER_ATTEMPT", attempt, 1) != 0 ||
        setenv("MUSTER_WORKER_TOKEN_FD", "0", 1) != 0)
      _exit(127);
    execvp(argv[0], argv);
    fprintf(stderr, "muster-workerd: error: cannot run srun: %s\n", strerror(errno));
    _exit(127);
  }
  close(p[0]);
  if (pid > 0) {
    size_t len = strlen(s->token);
    /* (a pipe holds far more than one line: this never blocks) */
    if (write(p[1], s->token, len) != (ssize_t)len || write(p[1], "\n", 1) != 1)
      fprintf(stderr, "muster-workerd: error: could not hand %s its token\n", s->id);
  } else {
    fprintf(stderr, "muster-workerd: error: fork: %s\n", strerror(errno));
  }
  close(p[1]);
  return pid;
}

/* Step s's workerd got no token on srun's stdin (WD_EXIT_NO_TOKEN): some
 * other process of the account read it first. Tells the controller with
 * the token s was given (a register with "token_lost"), which fails the
 * worker saying so, at once rather than at its start timeout. */
static void job_report_lost(const char *url, const struct job_step *s) {
  char path[700], body[160];
  struct job_buf b = {0};
  long code = 0;

  fprintf(stderr,
          "muster-workerd: error: %s's muster-workerd got no token on its stdin: another "
          "process of this account read it from srun first\n",
          s->id);
  snprintf(path, sizeof(path), "/api/v1/workers/%.15s/register", s->id);
  snprintf(body, sizeof(body),
           "{\"ip_address\": \"127.0.0.1\", \"attempt\": %d, \"pid\": %ld, \"token_lost\": true}",
           s->attempt, (long)getpid());
  (void)job_post(url, path, s->token, body, &b, &code);
  fprintf(stderr, "muster-workerd: the controller's answer (HTTP %ld): %.400s\n", code,
          b.p ? b.p : b.err);
  if (b.p)
    explicit_bzero(b.p, b.n);
  free(b.p);
}

int job_check_dumpable(int dumpable) {
  const char *account = getenv("MUSTER_JOB_ACCOUNT");
  struct stat st;

  if (dumpable != 1 || !account || !*account)
    return 0;
  if (stat("/proc/self/exe", &st) != 0)
    memset(&st, 0, sizeof(st));
  fprintf(stderr,
          "muster-workerd: error: this muster-workerd is readable by %s (mode %04o, owner uid "
          "%u), so it started dumpable: any process of %s could open its /proc environ and "
          "memory (the job's secret, a worker's token) before its first line. Make it "
          "root-owned, mode 0711 (as CMake builds and installs it; docs/backends.md)\n",
          account, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, account);
  return -1;
}

int job_main(const char *script, const char *workerd) {
  static struct job_step st[JOB_MAX];
  char secret[128] = "", url[600];
  const char *v;
  int n;

  /* (main() made this process non-dumpable at its first line, and checked
   * that it was from exec on: only root reads its environment and memory,
   * the secret, not the steps of this job's account) */
  v = getenv("MUSTER_JOB_SECRET");
  if (v && strlen(v) < sizeof(secret))
    snprintf(secret, sizeof(secret), "%s", v);
  if (v)
    explicit_bzero((char *)v, strlen(v)); /* the copy in the original environment */
  unsetenv("MUSTER_JOB_SECRET");
  /* A step's srun that dies before it reads its token must not take this
   * launcher with it (the write gets EPIPE): the other steps still start. */
  signal(SIGPIPE, SIG_IGN);
  v = getenv("MUSTER_CONTROLLER_URL");
  snprintf(url, sizeof(url), "%s", v ? v : "");
  if (!secret[0] || !url[0]) {
    fprintf(stderr, "muster-workerd: error: --job needs MUSTER_JOB_SECRET and "
                    "MUSTER_CONTROLLER_URL (a job muster submitted has them)\n");
    return 1;
  }
  n = job_read_script(script, st);
  if (n < 0 || job_claim(url, secret, st, n) != 0) {
    explicit_bzero(secret, sizeof(secret));
    return 1;
  }
  explicit_bzero(secret, sizeof(secret));
  /* (a worker the claim gave no token has ended, or has a newer attempt:
   * its step is not started) */
  for (int i = 0; i < n; i++) {
    st[i].pid = 0;
    if (st[i].token[0])
      st[i].pid = job_start_step(&st[i], workerd);
    if (st[i].pid <= 0)
      explicit_bzero(st[i].token, sizeof(st[i].token));
  }
  /* As the shell's `wait`: the job lasts while its steps do. A step's
   * token stays here (non-dumpable) until its srun ends: a workerd that
   * got none is reported with it. */
  for (;;) {
    int status;
    pid_t pid = wait(&status);

    if (pid < 0 && errno == EINTR)
      continue;
    if (pid < 0)
      break;
    for (int i = 0; i < n; i++) {
      if (st[i].pid != pid)
        continue;
      if (WIFEXITED(status) && WEXITSTATUS(status) == WD_EXIT_NO_TOKEN)
        job_report_lost(url, &st[i]);
      explicit_bzero(st[i].token, sizeof(st[i].token));
      st[i].pid = 0;
    }
  }
  return 0;
}
