/* validate.c: see validate.h. */
#include "validate.h"

#include "session_name.h"

#include "utf8.h"

#include "muster_errors.h"
#include "resources.h"

#include <arpa/inet.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(int code, const char **field, const char *name, char *msg, size_t msglen,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int fail(int code, const char **field, const char *name, char *msg, size_t msglen,
                const char *fmt, ...) {
  va_list ap;

  *field = name;
  va_start(ap, fmt);
  vsnprintf(msg, msglen, fmt, ap);
  va_end(ap);
  return code;
}

/* "P-" and 10 of [a-z0-9]. */
static int id_with_prefix(const char *s, char prefix) {
  if (!s || strlen(s) != 12 || s[0] != prefix || s[1] != '-')
    return 0;
  for (int i = 2; i < 12; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')))
      return 0;
  return 1;
}

int validate_worker_id(const char *s) {
  return id_with_prefix(s, 'w');
}

int validate_run_id(const char *s) {
  return id_with_prefix(s, 'r');
}

int validate_name(const char *s) {
  return s && session_bare_ok(s, strlen(s));
}

static int env_key_ok(const char *k) {
  size_t n = strlen(k);

  if (n == 0 || n > 256 || (k[0] >= '0' && k[0] <= '9'))
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = k[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return 0;
  }
  return 1;
}

static int kernel_ok(const char *k) {
  size_t n = strlen(k);

  if (n == 0 || n > 255)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = k[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '.' || c == '-' || c == '+' || c == '/'))
      return 0;
  }
  return 1;
}

const char *validate_kernel_code_flag(const char *kernel) {
  static const char *const dash_c[] = {"python", "python2", "python3", "bash",
                                       "sh",     "dash",    "zsh",     "ksh"};
  static const char *const dash_e[] = {"perl", "ruby", "node", "Rscript", "r", "R"};
  const char *base = strrchr(kernel, '/');

  base = base ? base + 1 : kernel;
  for (size_t i = 0; i < sizeof(dash_c) / sizeof(dash_c[0]); i++)
    if (strcmp(base, dash_c[i]) == 0)
      return "-c";
  /* python3.11 and the like */
  if (strncmp(base, "python", 6) == 0)
    return "-c";
  for (size_t i = 0; i < sizeof(dash_e) / sizeof(dash_e[0]); i++)
    if (strcmp(base, dash_e[i]) == 0)
      return "-e";
  return NULL;
}

static int string_array(json_t *v, const char *name, int nonempty, const char **field, char *msg,
                        size_t msglen) {
  size_t i;
  json_t *item;

  if (!json_is_array(v))
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s must be an array of strings", name);
  if (nonempty && json_array_size(v) == 0)
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s must not be empty", name);
  if (json_array_size(v) > 4096)
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s has more than 4096 elements", name);
  json_array_foreach(v, i, item) {
    if (!json_is_string(item))
      return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s[%zu] must be a string", name, i);
    if (strlen(json_string_value(item)) != json_string_length(item))
      return fail(MUSTER_E_INVALID, field, name, msg, msglen,
                  "%s[%zu] must not contain a NUL character", name, i);
  }
  return 0;
}

static int string_object(json_t *v, const char *name, const char **field, char *msg,
                         size_t msglen) {
  const char *k;
  json_t *val;

  if (!json_is_object(v))
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s must be an object of strings",
                name);
  json_object_foreach(v, k, val) {
    if (!env_key_ok(k))
      return fail(MUSTER_E_INVALID, field, name, msg, msglen,
                  "%s has an invalid variable name \"%.64s\" (letters, digits and _ only)", name,
                  k);
    if (!json_is_string(val))
      return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s.%.64s must be a string", name, k);
    if (strlen(json_string_value(val)) != json_string_length(val))
      return fail(MUSTER_E_INVALID, field, name, msg, msglen,
                  "%s.%.64s must not contain a NUL character", name, k);
  }
  return 0;
}

/* Reads an optional string field; NULL or absent leaves *out as it is. */
static int opt_string(json_t *body, const char *name, size_t max, const char **out,
                      const char **field, char *msg, size_t msglen) {
  json_t *v = json_object_get(body, name);

  if (!v || json_is_null(v))
    return 0;
  if (!json_is_string(v))
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s must be a string", name);
  if (json_string_length(v) > max)
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s is longer than %zu characters",
                name, max);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s must not contain a NUL character",
                name);
  *out = json_string_value(v);
  return 0;
}

/* A resource number in [lo, hi] (unit: its word for the message). A 0 or a
 * tiny value would be a container without a limit that admission counts as
 * free; a huge one overflows what a backend writes. */
static int opt_number(json_t *body, const char *name, double lo, double hi, const char *unit,
                      double *out, const char **field, char *msg, size_t msglen) {
  json_t *v = json_object_get(body, name);
  double d;

  if (!v || json_is_null(v))
    return 0;
  if (!json_is_number(v))
    return fail(MUSTER_E_INVALID, field, name, msg, msglen, "%s must be a number", name);
  d = json_number_value(v);
  if (!isfinite(d) || d < lo || d > hi)
    return fail(MUSTER_E_INVALID, field, name, msg, msglen,
                "%s must be between %g and %g %s (got %g)", name, lo, hi, unit, d);
  *out = d;
  return 0;
}

const char *validate_unknown_field(json_t *body, const char *const *known, size_t n) {
  const char *key;
  json_t *v;

  json_object_foreach(body, key, v) {
    size_t i;
    for (i = 0; i < n && strcmp(key, known[i]) != 0; i++)
      ;
    if (i == n)
      return key;
  }
  return NULL;
}

int validate_launch(json_t *body, struct launch_req *out, const char **field, char *msg,
                    size_t msglen) {
  static const char *const known[] = {
      "n",   "cpu",        "memory", "nvidia_gpu", "script",  "code", "command", "kernel", "args",
      "env", "secret_env", "role",   "name",       "session", "run",  "cwd",     "path"};
  const char *key;
  json_t *v;
  int rc, programs = 0;

  memset(out, 0, sizeof(*out));
  out->cpu = 1;
  out->memory = 1;
  out->kernel = "python3";
  out->role = "worker";
  out->session = "default";
  *field = NULL;

  if (!json_is_object(body))
    return fail(MUSTER_E_MALFORMED, field, NULL, msg, msglen,
                "the request body must be a JSON object");
  key = validate_unknown_field(body, known, sizeof(known) / sizeof(known[0]));
  if (key)
    return fail(MUSTER_E_INVALID, field, "body", msg, msglen,
                "unknown field \"%.64s\" (known: n, cpu, memory, nvidia_gpu, script, "
                "code, command, kernel, args, env, secret_env, role, name, session, run, cwd, "
                "path)",
                key);

  v = json_object_get(body, "n");
  if (!v)
    return fail(MUSTER_E_INVALID, field, "n", msg, msglen, "n (the number of workers) is required");
  if (!json_is_integer(v))
    return fail(MUSTER_E_INVALID, field, "n", msg, msglen, "n must be an integer");
  if (json_integer_value(v) < 1 || json_integer_value(v) > LAUNCH_MAX_N)
    return fail(MUSTER_E_INVALID, field, "n", msg, msglen, "n must be between 1 and %d (got %lld)",
                LAUNCH_MAX_N, (long long)json_integer_value(v));
  out->n = (long)json_integer_value(v);

  if ((rc = opt_number(body, "cpu", RES_CPU_MIN, RES_CPU_MAX, "cores", &out->cpu, field, msg,
                       msglen)) ||
      (rc = opt_number(body, "memory", RES_MEMORY_MIN_GIB, RES_MEMORY_MAX_GIB, "GiB", &out->memory,
                       field, msg, msglen)))
    return rc;
  v = json_object_get(body, "nvidia_gpu");
  if (v && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 64)
      return fail(MUSTER_E_INVALID, field, "nvidia_gpu", msg, msglen,
                  "nvidia_gpu must be an integer between 0 and 64");
    out->nvidia_gpu = (int)json_integer_value(v);
  }

  if ((rc = opt_string(body, "script", 4096, &out->script, field, msg, msglen)) ||
      (rc = opt_string(body, "code", 256 * 1024, &out->code, field, msg, msglen)) ||
      (rc = opt_string(body, "kernel", 255, &out->kernel, field, msg, msglen)) ||
      (rc = opt_string(body, "role", 64, &out->role, field, msg, msglen)) ||
      (rc = opt_string(body, "name", 128, &out->name, field, msg, msglen)) ||
      (rc = opt_string(body, "session", SESSION_STORED_MAX - 1, &out->session, field, msg,
                       msglen)) ||
      (rc = opt_string(body, "run", 64, &out->run, field, msg, msglen)) ||
      (rc = opt_string(body, "cwd", LAUNCH_MAX_CWD, &out->cwd, field, msg, msglen)) ||
      (rc = opt_string(body, "path", LAUNCH_MAX_PATH, &out->path, field, msg, msglen)))
    return rc;
  /* The worker's host resolves it, not the controller's: only its form is
   * checked here; a directory missing there fails the worker with a
   * sentence that names it. */
  if (out->cwd && !*out->cwd)
    out->cwd = NULL;
  if (out->cwd && out->cwd[0] != '/')
    return fail(MUSTER_E_INVALID, field, "cwd", msg, msglen,
                "cwd must be an absolute directory (starting with /), not \"%.200s\"", out->cwd);
  if (out->path && !*out->path)
    out->path = NULL;
  if (out->run && !validate_run_id(out->run))
    return fail(MUSTER_E_INVALID, field, "run", msg, msglen,
                "run must be a run id (like \"r-3kf9x2m1qa\")");
  /* CML passes script="" and code="" for "not given". */
  if (out->script && !*out->script)
    out->script = NULL;
  if (out->code && !*out->code)
    out->code = NULL;
  if (!kernel_ok(out->kernel))
    return fail(MUSTER_E_INVALID, field, "kernel", msg, msglen,
                "kernel must be a program name or path (letters, digits, . _ - + /)");
  if (!validate_name(out->role))
    return fail(MUSTER_E_INVALID, field, "role", msg, msglen,
                "role must be 1 to 64 letters, digits, '_', '.' or '-'");
  /* (or a user's as stored, "USER/name": whose it may be is the API's
   * business, api_scope.c) */
  if (!session_name_ok(out->session))
    return fail(MUSTER_E_INVALID, field, "session", msg, msglen,
                "session must be 1 to 64 letters, digits, '_', '.' or '-'");

  v = json_object_get(body, "command");
  if (v && !json_is_null(v)) {
    if ((rc = string_array(v, "command", 1, field, msg, msglen)))
      return rc;
    out->command = v;
  }
  v = json_object_get(body, "args");
  if (v && !json_is_null(v)) {
    if ((rc = string_array(v, "args", 0, field, msg, msglen)))
      return rc;
    out->args = v;
  }
  v = json_object_get(body, "env");
  if (v && !json_is_null(v)) {
    if ((rc = string_object(v, "env", field, msg, msglen)))
      return rc;
    out->env = v;
  }
  v = json_object_get(body, "secret_env");
  if (v && !json_is_null(v)) {
    if ((rc = string_object(v, "secret_env", field, msg, msglen)))
      return rc;
    out->secret_env = v;
  }

  programs = !!out->script + !!out->code + !!out->command;
  if (programs > 1)
    return fail(MUSTER_E_INVALID, field, out->command ? "command" : "code", msg, msglen,
                "give at most one of script, code and command");
  if (out->code && out->code[0] != '!' && !validate_kernel_code_flag(out->kernel))
    return fail(MUSTER_E_INVALID, field, "kernel", msg, msglen,
                "kernel \"%s\" is not known to run inline code; use script or command",
                out->kernel);
  return 0;
}

int validate_await(json_t *body, struct await_req *out, const char **field, char *msg,
                   size_t msglen) {
  json_t *ids, *v, *item;
  size_t i;

  memset(out, 0, sizeof(*out));
  out->wait_for_completion = 1;
  out->timeout_seconds = 60;
  *field = NULL;
  if (!json_is_object(body))
    return fail(MUSTER_E_MALFORMED, field, NULL, msg, msglen,
                "the request body must be a JSON object");
  ids = json_object_get(body, "ids");
  if (!ids || !json_is_array(ids))
    return fail(MUSTER_E_INVALID, field, "ids", msg, msglen,
                "ids must be an array of worker ids or worker objects");
  if (json_array_size(ids) > 65536)
    return fail(MUSTER_E_INVALID, field, "ids", msg, msglen, "ids has too many elements");
  v = json_object_get(body, "wait_for_completion");
  if (v && !json_is_null(v)) {
    if (!json_is_boolean(v))
      return fail(MUSTER_E_INVALID, field, "wait_for_completion", msg, msglen,
                  "wait_for_completion must be true or false");
    out->wait_for_completion = json_is_true(v);
  }
  v = json_object_get(body, "timeout_seconds");
  if (v && !json_is_null(v)) {
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0 ||
        json_number_value(v) > 30 * 86400)
      return fail(MUSTER_E_INVALID, field, "timeout_seconds", msg, msglen,
                  "timeout_seconds must be a number from 0 (no timeout) to 2592000");
    out->timeout_seconds = json_number_value(v);
  }
  out->ids = json_array();
  json_array_foreach(ids, i, item) {
    const char *id = NULL;
    if (json_is_string(item))
      id = json_string_value(item);
    else if (json_is_object(item) && json_is_string(json_object_get(item, "id")))
      id = json_string_value(json_object_get(item, "id"));
    if (!validate_worker_id(id)) {
      json_decref(out->ids);
      out->ids = NULL;
      return fail(MUSTER_E_INVALID, field, "ids", msg, msglen,
                  "ids[%zu] is not a worker id (like \"w-3kf9x2m1qa\") or a worker object", i);
    }
    json_array_append_new(out->ids, json_string(id));
  }
  return 0;
}

/* An integer member in [lo, hi], or 0. */
static json_int_t int_in(json_t *body, const char *key, json_int_t lo, json_int_t hi) {
  json_t *v = json_object_get(body, key);
  return json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi
             ? json_integer_value(v)
             : 0;
}

int validate_register(json_t *body, struct register_req *out, const char **field, char *msg,
                      size_t msglen) {
  unsigned char addr[16];
  const char *ip;

  memset(out, 0, sizeof(*out));
  *field = NULL;
  if (!json_is_object(body))
    return fail(MUSTER_E_MALFORMED, field, NULL, msg, msglen,
                "the request body must be a JSON object");
  ip = json_string_value(json_object_get(body, "ip_address"));
  if (!ip || strlen(ip) >= sizeof(out->ip_address) ||
      (inet_pton(AF_INET, ip, addr) != 1 && inet_pton(AF_INET6, ip, addr) != 1))
    return fail(MUSTER_E_INVALID, field, "ip_address", msg, msglen,
                "ip_address must be an IP address");
  snprintf(out->ip_address, sizeof(out->ip_address), "%s", ip);
  out->hostname = json_string_value(json_object_get(body, "hostname"));
  if (out->hostname && strlen(out->hostname) > 255)
    out->hostname = NULL;
  out->exec_port = (int)int_in(body, "exec_port", 1, 65535);
  out->pid = (int)int_in(body, "pid", 1, (1 << 30) - 1);
  out->start_time = (unsigned long long)int_in(body, "start_time", 1, LLONG_MAX);
  out->attempt = (int)int_in(body, "attempt", 1, (1 << 30) - 1);
  out->rotate = json_is_true(json_object_get(body, "rotate"));
  out->token_lost = json_is_true(json_object_get(body, "token_lost"));
  return 0;
}

int validate_exit(json_t *body, struct exit_req *out, const char **field, char *msg,
                  size_t msglen) {
  json_t *code, *sig;
  const char *reason;

  memset(out, 0, sizeof(*out));
  *field = NULL;
  if (!json_is_object(body))
    return fail(MUSTER_E_MALFORMED, field, NULL, msg, msglen,
                "the request body must be a JSON object");
  code = json_object_get(body, "exit_code");
  sig = json_object_get(body, "signal");
  if ((code && !json_is_null(code) && !json_is_integer(code)) ||
      (sig && !json_is_null(sig) && !json_is_integer(sig)))
    return fail(MUSTER_E_INVALID, field, "exit_code", msg, msglen,
                "exit_code and signal must be integers or null");
  /* An exit status is 0..255: anything else is no status a process can
   * have (a -1 was once recorded as a success without a code). */
  if (json_is_integer(code) && (json_integer_value(code) < 0 || json_integer_value(code) > 255))
    return fail(MUSTER_E_INVALID, field, "exit_code", msg, msglen,
                "exit_code must be an exit status, 0 to 255, or null, not %" JSON_INTEGER_FORMAT,
                json_integer_value(code));
  out->has_exit_code = json_is_integer(code);
  if (json_is_integer(code))
    out->exit_code = (int)json_integer_value(code);
  out->signal = (int)int_in(body, "signal", 1, 127);
  if (out->signal)
    snprintf(out->failure, sizeof(out->failure), "the script was killed by signal %d (%s)",
             out->signal, strsignal(out->signal));
  else if (out->exit_code > 0)
    snprintf(out->failure, sizeof(out->failure), "the script exited with code %d", out->exit_code);
  reason = json_string_value(json_object_get(body, "reason"));
  /* At most 1000 bytes of it, cut between two characters: a failure that
   * is no UTF-8 would be left out of every answer. */
  if (reason && *reason)
    snprintf(out->failure, sizeof(out->failure), "%.*s", (int)utf8_fit(reason, 1000), reason);
  return 0;
}
