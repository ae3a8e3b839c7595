/*
 * exec_hello.c: the exec channel's hello (docs/exec-protocol.md), the first
 * frame of a connection once its TLS handshake held: argv, env and cwd, and
 * the command it asks for is built (struct ex_cmd) for exec_relay.c to
 * start. A hello that fails is refused by exec_server.c with the sentence
 * written here.
 */
#include "exec_internal.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Length of the longest prefix of s, at most max bytes, that does not cut a
 * UTF-8 sequence (the hello's strings are valid UTF-8, checked by Jansson). */
size_t ex_utf8_prefix(const char *s, size_t max) {
  size_t n = strlen(s);

  if (n <= max)
    return n;
  n = max;
  while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
    n--;
  return n;
}

/* Builds the command's environment: the worker's script environment with
 * env (a JSON object of strings, borrowed; may be NULL) on top. Returns a new
 * NULL-terminated array (strv_free()), or NULL if out of memory. */
static char **ex_envp_build(json_t *env) {
  size_t own = 0, i = 0;
  const char *key;
  json_t *val;
  char **v;

  for (char **e = wd.envp; e && *e; e++)
    own++;
  v = calloc(own + json_object_size(env) + 1, sizeof(char *));
  if (!v)
    return NULL;
  for (char **e = wd.envp; e && *e; e++) {
    size_t kl = strcspn(*e, "=");

    if (env && json_object_getn(env, *e, kl))
      continue; /* the hello's value wins */
    if (!(v[i++] = strdup(*e)))
      goto fail;
  }
  json_object_foreach(env, key, val) {
    size_t kl = strlen(key), vl = json_string_length(val);

    if (!(v[i] = malloc(kl + vl + 2)))
      goto fail;
    memcpy(v[i], key, kl);
    v[i][kl] = '=';
    memcpy(v[i] + kl + 1, json_string_value(val), vl + 1);
    i++;
  }
  return v;
fail:
  strv_free(v);
  return NULL;
}

/* True if j is a JSON string without NUL bytes (which C strings cannot
 * carry); non-empty too if nonempty. */
static bool ex_is_cstring(json_t *j, bool nonempty) {
  return json_is_string(j) && strlen(json_string_value(j)) == json_string_length(j) &&
         (!nonempty || json_string_length(j) > 0);
}

/* Checks the hello (text, len bytes) and builds the command it asks for
 * into cmd (which must be zeroed; ex_cmd_cleanup() frees it, whatever this
 * returns), naming c after argv[0]. Returns 0, or MUSTER_E_INVALID or
 * MUSTER_E_NOMEM with err (size bytes) saying why, for the refusal. */
MUST_CHECK int ex_hello_parse(struct ex_conn *c, const char *text, size_t len, struct ex_cmd *cmd,
                              char *err, size_t size) {
  json_t *hello = json_loadb(text, len, 0, NULL);
  json_t *token = json_object_get(hello, "token");
  json_t *jargv = json_object_get(hello, "argv");
  json_t *env = json_object_get(hello, "env");
  json_t *jcwd = json_object_get(hello, "cwd");
  json_t *val;
  const char *key;
  size_t i;
  int rc = MUSTER_E_INVALID;

  cmd->hello = hello;
  cmd->cwd = wd.cwd;
  if (!json_is_object(hello)) {
    snprintf(err, size, "the hello is not a JSON object");
    goto out;
  }
  /* The TLS handshake proved the token (exec_tls.c); a hello that names
   * one all the same must name that one. */
  if (!wd.exec_token) {
    snprintf(err, size, "%s", EXEC_WIRE_ERR_NO_TOKEN);
    goto out;
  }
  if (token && (!ex_is_cstring(token, false) ||
                !util_secret_equal(json_string_value(token), wd.exec_token))) {
    snprintf(err, size, "%s", EXEC_WIRE_ERR_TOKEN);
    goto out;
  }
  if (!json_is_array(jargv) || json_array_size(jargv) == 0 ||
      json_array_size(jargv) > WD_ARGV_MAX) {
    snprintf(err, size, "argv is not a non-empty array of at most 4096 strings");
    goto out;
  }
  json_array_foreach(jargv, i, val) {
    if (!ex_is_cstring(val, i == 0)) {
      snprintf(err, size, "argv[%zu] is not a %sstring", i, i == 0 ? "non-empty " : "");
      goto out;
    }
  }
  if (json_is_null(env))
    env = NULL;
  if (env && (!json_is_object(env) || json_object_size(env) > WD_ENV_MAX)) {
    snprintf(err, size, "env is not an object of at most 4096 strings");
    goto out;
  }
  json_object_foreach(env, key, val) {
    /* Values are never logged or echoed: they may be secrets. */
    if (key[0] == '\0' || strchr(key, '=') || !ex_is_cstring(val, false)) {
      snprintf(err, size, "env entry \"%.*s\" is not NAME: string", (int)ex_utf8_prefix(key, 64),
               key);
      goto out;
    }
  }
  if (jcwd && !json_is_null(jcwd)) {
    if (!ex_is_cstring(jcwd, true)) {
      snprintf(err, size, "cwd is not a non-empty string or null");
      goto out;
    }
    cmd->cwd = json_string_value(jcwd);
  }

  snprintf(c->name, sizeof(c->name), "%.*s",
           (int)ex_utf8_prefix(json_string_value(json_array_get(jargv, 0)), EX_NAME_MAX),
           json_string_value(json_array_get(jargv, 0)));
  LOG(LOG_INFO, "exec from %s: %s (%zu args)", c->peer, c->name, json_array_size(jargv) - 1);

  rc = MUSTER_E_NOMEM;
  cmd->argv = calloc(json_array_size(jargv) + 1, sizeof(char *));
  if (!cmd->argv)
    goto nomem;
  json_array_foreach(jargv, i, val) {
    if (!(cmd->argv[i] = strdup(json_string_value(val))))
      goto nomem;
  }
  if (!(cmd->envp = ex_envp_build(env)))
    goto nomem;
  rc = 0;
  goto out;

nomem:
  snprintf(err, size, "muster-workerd is out of memory");
out:
  return rc;
}

/* Frees what ex_hello_parse() put in cmd; harmless on a zeroed cmd. */
void ex_cmd_cleanup(struct ex_cmd *cmd) {
  strv_free(cmd->argv);
  strv_free(cmd->envp);
  json_decref(cmd->hello);
  *cmd = (struct ex_cmd){0};
}
