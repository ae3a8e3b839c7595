/* cli_util.c: what every muster command shares: the controller named by
 * the global options and the client connected to it, usage and failure
 * messages with their exit codes, number and id parsing, and the worker
 * output more than one command prints. It calls only libmuster. */
#include "cli.h"
#include "resources.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_IDS 65536

const char *opt_url, *opt_token;

/* Reports a failed call and returns the exit code for it. */
int call_failed(muster_client *c, int rc) {
  const char *msg = muster_client_errmsg(c);
  const char *field = muster_client_errfield(c);

  fprintf(stderr, "muster: %s: %s", muster_error_name(rc), msg && *msg ? msg : muster_strerror(rc));
  if (field)
    fprintf(stderr, " (field: %s)", field);
  fputc('\n', stderr);
  return exit_code_for(rc);
}

int exit_code_for(int rc) {
  /* No default: -Wall names a new row of the error table left out here. */
  switch ((muster_error)rc) {
  case MUSTER_OK:
    return EXIT_OK;
  case MUSTER_E_NOT_FOUND:
    return EXIT_NOT_FOUND;
  case MUSTER_E_MALFORMED:
  case MUSTER_E_UNAUTHORIZED:
  case MUSTER_E_FORBIDDEN:
  case MUSTER_E_CONFLICT:
  case MUSTER_E_TOO_LARGE:
  case MUSTER_E_INVALID:
  case MUSTER_E_METHOD:
  case MUSTER_E_CAPACITY:
    return EXIT_REFUSED;
  case MUSTER_E_SHUTTING_DOWN:
  case MUSTER_E_UNREACHABLE:
  case MUSTER_E_TIMEOUT:
  case MUSTER_E_BACKEND_DOWN:
    return EXIT_UNREACHABLE;
  case MUSTER_E_NOMEM:
  case MUSTER_E_INTERNAL:
  case MUSTER_E_DB:
  case MUSTER_E_SCHEMA_TOO_NEW:
  case MUSTER_E_IO:
  case MUSTER_E_PROTOCOL:
  case MUSTER_E_BACKEND:
    return EXIT_INTERNAL;
  }
  return EXIT_INTERNAL;
}

int connect_client(muster_client **c) {
  const char *url;
  int rc;

  /* --url and --token are MUSTER_URL and MUSTER_TOKEN given on the command
   * line: either alone takes the other from the environment or the state
   * directory, exactly as the variables do. Set in the environment, they
   * also reach what this command starts (muster run's rsh agents find the
   * same controller). */
  if ((opt_url && setenv("MUSTER_URL", opt_url, 1) != 0) ||
      (opt_token && setenv("MUSTER_TOKEN", opt_token, 1) != 0))
    return out_of_memory();
  rc = muster_client_new_default(c);
  if (rc == MUSTER_E_UNREACHABLE) {
    fprintf(stderr, "muster: no controller found: set MUSTER_URL and MUSTER_TOKEN, pass --url "
                    "and --token, or start one (muster-controller &)\n");
    return EXIT_UNREACHABLE;
  }
  if (rc == MUSTER_E_UNAUTHORIZED) {
    fprintf(stderr, "muster: no API token: set MUSTER_TOKEN or pass --token (the local "
                    "controller keeps it in its state directory's token file, which is sent "
                    "only to that controller's own URL or a loopback address)\n");
    return EXIT_REFUSED;
  }
  if (rc == MUSTER_E_INVALID) {
    url = getenv("MUSTER_URL");
    fprintf(stderr,
            "muster: bad controller URL or token: the URL must look like http://HOST:PORT "
            "(or HOST:PORT)%s%s%s, the token be one word\n",
            url ? ", not \"" : "", url ? url : "", url ? "\"" : "");
    return EXIT_USAGE;
  }
  if (rc) {
    fprintf(stderr, "muster: could not make a client: %s\n", muster_strerror(rc));
    return exit_code_for(rc);
  }
  return 0;
}

const char *session_default(void) {
  const char *s = getenv("MUSTER_SESSION");
  return s && *s ? s : NULL;
}

/* ---- output ---- */

/* The worker object exactly as the controller sent it. */
void print_worker_json(const muster_worker *w) {
  fputs(w->json ? w->json : "null", stdout);
}

/* What muster launch prints: the ids, one per line, or the workers as JSON. */
void print_launched(const muster_worker_list *l, int as_json) {
  if (as_json)
    print_list_json(l);
  else
    for (size_t i = 0; i < l->count; i++)
      printf("%s\n", l->items[i].id);
}

void print_list_json(const muster_worker_list *l) {
  printf("[");
  for (size_t i = 0; i < l->count; i++) {
    printf(i ? ",\n " : "");
    print_worker_json(&l->items[i]);
  }
  printf("]\n");
}

/* A failure's sentence, then its quoted stderr lines, each indented. */
void print_failure(FILE *out, const char *failure, const char *indent) {
  const char *nl;

  while ((nl = strchr(failure, '\n')) != NULL) {
    fprintf(out, "%.*s\n%s", (int)(nl - failure), failure, indent);
    failure = nl + 1;
  }
  fprintf(out, "%s\n", failure);
}

/* The sentence and the last quoted line (a traceback's last) on one line. */
void fmt_failure_line(const char *failure, char *buf, size_t size) {
  const char *nl = strchr(failure, '\n');
  const char *last = strrchr(failure, '\n');

  if (!nl)
    snprintf(buf, size, "%s", failure);
  else
    snprintf(buf, size, "%.*s %s", (int)(nl - failure), failure, last + 1);
}

/* Seconds since an ISO time of the controller, or -1. */
double age_of(const char *iso) {
  struct tm tm;
  char *end;
  time_t t;

  if (!iso)
    return -1;
  memset(&tm, 0, sizeof(tm));
  end = strptime(iso, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end)
    return -1;
  t = timegm(&tm);
  return difftime(time(NULL), t);
}

void fmt_age(double s, char *buf, size_t size) {
  if (s < 0)
    snprintf(buf, size, "-");
  else if (s < 120)
    snprintf(buf, size, "%.0fs", s);
  else if (s < 7200)
    snprintf(buf, size, "%.0fm", s / 60);
  else if (s < 172800)
    snprintf(buf, size, "%.0fh", s / 3600);
  else
    snprintf(buf, size, "%.0fd", s / 86400);
}

/* ---- argument helpers ---- */

MUST_CHECK int parse_double(const char *s, double min, double *out) {
  char *end;
  double v;

  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < min)
    return -1;
  *out = v;
  return 0;
}

MUST_CHECK int parse_resource(const char *flag, const char *s, double *out, char *msg,
                              size_t msglen) {
  int cpu = strstr(flag, "cpu") != NULL;
  double lo = cpu ? RES_CPU_MIN : RES_MEMORY_MIN_GIB, hi = cpu ? RES_CPU_MAX : RES_MEMORY_MAX_GIB;

  if (parse_double(s, lo, out) == 0 && *out <= hi)
    return 0;
  snprintf(msg, msglen, "%s must be a number from %g to %g (%s), not \"%s\"", flag, lo, hi,
           cpu ? "cores" : "GiB", s);
  return -1;
}

int is_run_id(const char *s) {
  return strlen(s) == 12 && strncmp(s, "r-", 2) == 0 &&
         strspn(s + 2, "abcdefghijklmnopqrstuvwxyz0123456789") == 10;
}

MUST_CHECK int cli_abs_dir(const char *dir, char *buf, size_t size) {
  char real[PATH_MAX];

  if (dir[0] == '/')
    return snprintf(buf, size, "%s", dir) < (int)size ? 0 : -1;
  if (!realpath(dir, real))
    return -1;
  return snprintf(buf, size, "%s", real) < (int)size ? 0 : -1;
}

MUST_CHECK int parse_int(const char *s, long min, long max, long *out) {
  char *end;
  long v;

  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

/* What a command says and exits with when memory runs out. */
int out_of_memory(void) {
  fprintf(stderr, "muster: out of memory\n");
  return EXIT_INTERNAL;
}

MUST_CHECK int strv_push(struct strv *s, const char *x) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    const char **v = realloc(s->v, cap * sizeof(*v));
    if (!v)
      return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
  return 0;
}

/* Reads whitespace-separated ids from stdin into ids (the strings are
 * kept in *store, freed by the caller). */
MUST_CHECK int read_ids_stdin(struct strv *ids, char **store) {
  size_t cap = 0, len = 0;
  char *buf = NULL;
  int ch;

  while ((ch = getchar()) != EOF) {
    if (len + 2 > cap) {
      char *grown;
      cap = cap ? cap * 2 : 4096;
      grown = cap > (size_t)MAX_IDS * 16 ? NULL : realloc(buf, cap);
      if (!grown) {
        free(buf);
        return -1;
      }
      buf = grown;
    }
    buf[len++] = (char)ch;
  }
  if (!buf)
    return 0;
  buf[len] = '\0';
  *store = buf;
  /* Whitespace-separated words, cut in place. */
  for (char *p = buf; *p;) {
    p += strspn(p, " \t\r\n");
    if (!*p)
      break;
    if (strv_push(ids, p) != 0)
      return -1;
    p += strcspn(p, " \t\r\n");
    if (*p)
      *p++ = '\0';
  }
  return 0;
}
