/*
 * client.c: muster-workerd's client of the controller.
 *
 * One libcurl easy handle, reused for keep-alive, POSTs to
 * {url}/api/v1/workers/{id}/{suffix} (http_post()); every call blocks, bounded
 * by a 10 s timeout. A call that must get through (registration, the exit
 * report) retries with a backoff of 100 ms doubling to 5 s, for 10 minutes
 * (backoff_wait()). Registration sends the worker's address and reads its
 * assignment (the command, environment, cwd, exec token) into wd. The
 * address itself, unless MUSTER_BIND_IP gives it, is the one that packets
 * toward the controller leave from (ip_toward_controller()).
 */
#include "envlists.h"
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <curl/curl.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* The controller's address                                                 */

/* Finds the local address that packets toward the controller leave from, by
 * connecting a UDP socket to it (which sends nothing) and asking the kernel
 * which source address it picked. Writes it into ip (size bytes).
 * Returns 0, MUSTER_E_INVALID if the URL cannot be parsed, or
 * MUSTER_E_UNREACHABLE if the controller's host has no address or route now
 * (the caller retries), MUSTER_E_NOMEM. */
MUST_CHECK int ip_toward_controller(char *ip, size_t size) {
  CURLU *u = curl_url();
  char *host = NULL;
  char *port = NULL;
  char *h;
  long port_num;
  struct addrinfo hints;
  struct addrinfo *res = NULL;
  socklen_t ip_size = (socklen_t)size;
  int fd = -1;
  int gai;
  int rc;

  if (!u) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  if (curl_url_set(u, CURLUPART_URL, wd.url, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
      util_parse_long(port, 1, 65535, &port_num) != 0) {
    LOG(LOG_ERROR, "MUSTER_CONTROLLER_URL is not a valid URL with a host and port");
    rc = MUSTER_E_INVALID;
    goto out;
  }
  /* libcurl returns IPv6 literals in brackets; getaddrinfo wants them bare. */
  h = host;
  if (h[0] == '[') {
    size_t n = strlen(h);
    h++;
    if (n >= 2 && h[n - 2] == ']')
      h[n - 2] = '\0';
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  gai = getaddrinfo(h, port, &hints, &res);
  if (gai != 0) {
    LOG(LOG_WARN, "cannot resolve the controller's host %s: %s", h, gai_strerror(gai));
    rc = MUSTER_E_UNREACHABLE;
    goto out;
  }
  rc = MUSTER_E_UNREACHABLE;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);

    fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, ip, ip_size, NULL, 0, NI_NUMERICHOST) == 0) {
      rc = 0;
      break;
    }
    close(fd);
    fd = -1;
  }
  if (rc)
    LOG(LOG_WARN, "no route toward the controller's host %s", h);
out:
  if (fd >= 0)
    close(fd);
  if (res)
    freeaddrinfo(res);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */

/* libcurl's write callback: appends the answer body to wd.answer, keeping it
 * NUL-terminated. Past WD_ANSWER_MAX it refuses the data, which aborts the
 * transfer with CURLE_WRITE_ERROR. */
static size_t http_on_data(char *data, size_t size, size_t nmemb, void *unused) {
  size_t n = size * nmemb;

  (void)unused;
  if (n > WD_ANSWER_MAX - wd.answer_len) {
    wd.answer_too_big = true;
    return 0;
  }
  memcpy(wd.answer + wd.answer_len, data, n);
  wd.answer_len += n;
  wd.answer[wd.answer_len] = '\0';
  return n;
}

/* Creates the one curl handle, its two header lists (both carrying the
 * bearer token) and the answer buffer; http_cleanup() frees them.
 * curl_global_init() must have been called. Returns 0 or MUSTER_E_NOMEM. */
MUST_CHECK int http_init(void) {
  char auth[WD_TOKEN_MAX + 32];
  struct curl_slist *l;
  int rc = MUSTER_E_NOMEM;

  snprintf(auth, sizeof(auth), "Authorization: Bearer %s", wd.token);
  wd.answer = malloc(WD_ANSWER_MAX + 1);
  wd.curl = curl_easy_init();
  if (!wd.answer || !wd.curl)
    goto out;
  wd.answer[0] = '\0';
  /* curl_slist_append returns NULL on failure and leaves the list as it was,
   * so each step keeps the list in wd where http_cleanup can free it. */
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  wd.hdr_json = l;
  /* "Expect:" stops libcurl from waiting for a 100-continue before large
   * bodies, which only adds a round trip against our controller. */
  if (!(l = curl_slist_append(wd.hdr_json, "Content-Type: application/json")))
    goto out;
  if (!(l = curl_slist_append(wd.hdr_json, "Expect:")))
    goto out;
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  wd.hdr_bytes = l;
  if (!(l = curl_slist_append(wd.hdr_bytes, "Content-Type: application/octet-stream")))
    goto out;
  if (!(l = curl_slist_append(wd.hdr_bytes, "Expect:")))
    goto out;

  curl_easy_setopt(wd.curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(wd.curl, CURLOPT_CONNECTTIMEOUT_MS, WD_CONNECT_TIMEOUT_MS);
  curl_easy_setopt(wd.curl, CURLOPT_TIMEOUT_MS, WD_CALL_TIMEOUT_MS);
  curl_easy_setopt(wd.curl, CURLOPT_WRITEFUNCTION, http_on_data);
  curl_easy_setopt(wd.curl, CURLOPT_ERRORBUFFER, wd.curl_err);
  curl_easy_setopt(wd.curl, CURLOPT_USERAGENT, "muster-workerd/" MUSTER_VERSION);
  /* Workers talk to the controller directly, as they talk to each other; a
   * site-wide http_proxy meant for the internet would only get in the way. */
  curl_easy_setopt(wd.curl, CURLOPT_PROXY, "");
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(wd.curl, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  rc = 0;
out:
  /* The token must not linger on the stack. */
  explicit_bzero(auth, sizeof(auth));
  return rc;
}

/* Frees what http_init() created; harmless if it failed part way. */
void http_cleanup(void) {
  curl_slist_free_all(wd.hdr_json);
  curl_slist_free_all(wd.hdr_bytes);
  if (wd.curl)
    curl_easy_cleanup(wd.curl);
  free(wd.answer);
  wd.hdr_json = wd.hdr_bytes = NULL;
  wd.curl = NULL;
  wd.answer = NULL;
}

/* POSTs body (len bytes; JSON if json, raw bytes otherwise) to
 * {url}/api/v1/workers/{id}/{suffix}. Returns 0 when the controller answered,
 * with the status in *status and the body in wd.answer (NUL-terminated, valid
 * until the next call); MUSTER_E_UNREACHABLE when no answer came (refused,
 * timed out, reset); MUSTER_E_TOO_LARGE when the answer passed 1 MiB;
 * MUSTER_E_NOMEM. */
MUST_CHECK int http_post(const char *suffix, bool json, const void *body, size_t len,
                         long *status) {
  char url[WD_URL_MAX + WD_ID_MAX + 64];
  sigset_t block, old;
  CURLcode cc;
  int rc = 0;
  int n;

  n = snprintf(url, sizeof(url), "%s/api/v1/workers/%s/%s", wd.url, wd.id, suffix);
  if (n < 0 || (size_t)n >= sizeof(url))
    return MUSTER_E_INTERNAL;
  wd.answer_len = 0;
  wd.answer[0] = '\0';
  wd.answer_too_big = false;
  wd.curl_err[0] = '\0';
  *status = 0;
  curl_easy_setopt(wd.curl, CURLOPT_URL, url);
  curl_easy_setopt(wd.curl, CURLOPT_HTTPHEADER, json ? wd.hdr_json : wd.hdr_bytes);
  curl_easy_setopt(wd.curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(wd.curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);

  /* Our handlers only write to the self-pipe, so holding the signals back
   * during the call loses nothing, and keeps EINTR out of libcurl's poll()
   * and the resolver; they are delivered as soon as the mask is restored. */
  sigemptyset(&block);
  sigaddset(&block, SIGCHLD);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &old);
  cc = curl_easy_perform(wd.curl);
  sigprocmask(SIG_SETMASK, &old, NULL);

  if (cc == CURLE_WRITE_ERROR && wd.answer_too_big) {
    LOG(LOG_WARN, "the controller's answer to %s was larger than 1 MiB", suffix);
    rc = MUSTER_E_TOO_LARGE;
  } else if (cc == CURLE_OUT_OF_MEMORY) {
    rc = MUSTER_E_NOMEM;
  } else if (cc != CURLE_OK) {
    if (wd.controller_up)
      LOG(LOG_WARN, "cannot reach the controller at %s (%s); will keep trying", wd.url,
          wd.curl_err[0] ? wd.curl_err : curl_easy_strerror(cc));
    LOG(LOG_DEBUG, "POST %s: %s", suffix, wd.curl_err[0] ? wd.curl_err : curl_easy_strerror(cc));
    wd.controller_up = false;
    rc = MUSTER_E_UNREACHABLE;
  } else {
    curl_easy_getinfo(wd.curl, CURLINFO_RESPONSE_CODE, status);
    /* A 5xx does not hold off MUSTER_ORPHAN_TIMEOUT: a proxy answers
     * 502/503/504 for a controller that is gone, and one that fails every
     * call for that long is no better. (Each caller says what a 5xx
     * means for its own call.) */
    if (*status < 500)
      wd.last_contact_ms = util_mono_ms();
    if (!wd.controller_up)
      LOG(LOG_INFO, "the controller answers again");
    wd.controller_up = true;
  }
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Backoff                                                                  */

/* Starts a backoff that gives up 10 minutes from now. */
void backoff_init(struct backoff *b) {
  b->give_up_ms = util_mono_ms() + WD_RETRY_TOTAL_MS;
  b->delay_ms = WD_RETRY_FIRST_MS;
}

/* Sleeps for the next delay of b (100 ms, doubling up to 5 s), never past
 * its end. Returns 0 when it is time to try again, MUSTER_E_TIMEOUT when the
 * 10 minutes are over, or, if interruptible, MUSTER_E_SHUTTING_DOWN as soon as
 * SIGTERM or SIGINT arrives (used before any child exists). */
MUST_CHECK int backoff_wait(struct backoff *b, bool interruptible) {
  int64_t now = util_mono_ms();
  int64_t until;

  if (now >= b->give_up_ms)
    return MUSTER_E_TIMEOUT;
  until = now + b->delay_ms;
  if (until > b->give_up_ms)
    until = b->give_up_ms;
  b->delay_ms = b->delay_ms * 2 > WD_RETRY_MAX_MS ? WD_RETRY_MAX_MS : b->delay_ms * 2;
  while ((now = util_mono_ms()) < until) {
    struct pollfd p = {.fd = wd.sig_read_fd, .events = POLLIN};
    bool child = false;
    int term = 0;

    if (poll(&p, 1, (int)(until - now)) > 0) {
      signals_take(&child, &term);
      if (term && interruptible)
        return MUSTER_E_SHUTTING_DOWN;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                             */

/* Reads the assignment in the register answer (ans: borrowed reference) into
 * wd.hb_interval_ms, wd.argv, wd.envp, wd.cwd, wd.script and wd.exec_token, which
 * cleanup() frees. Types are checked strictly, since a command run from a
 * mangled answer could do anything. Returns 0, MUSTER_E_PROTOCOL (logged) or
 * MUSTER_E_NOMEM. */
MUST_CHECK static int assignment_parse(json_t *ans) {
  json_t *hb = json_object_get(ans, "heartbeat_interval_seconds");
  json_t *cmd = json_object_get(ans, "command");
  json_t *env = json_object_get(ans, "env");
  json_t *cwd = json_object_get(ans, "cwd");
  json_t *script = json_object_get(ans, "script");
  json_t *xtok = json_object_get(ans, "exec_token");
  const char *key;
  json_t *val;
  size_t i;
  int rc = MUSTER_E_PROTOCOL;

  if (!json_is_object(ans)) {
    LOG(LOG_ERROR, "the register answer is not a JSON object");
    goto out;
  }
  wd.hb_interval_ms = WD_HEARTBEAT_DEFAULT_MS;
  if (hb && !json_is_null(hb)) {
    double s = json_number_value(hb);
    if (!json_is_number(hb) || !(s >= 0.1 && s <= 3600)) {
      LOG(LOG_ERROR, "heartbeat_interval_seconds is not a number of seconds in [0.1, 3600]");
      goto out;
    }
    wd.hb_interval_ms = (int64_t)(s * 1000);
  }

  if (cmd && !json_is_null(cmd)) {
    if (!json_is_array(cmd) || json_array_size(cmd) > WD_ARGV_MAX) {
      LOG(LOG_ERROR, "command is not an array of at most %d strings", WD_ARGV_MAX);
      goto out;
    }
    json_array_foreach(cmd, i, val) {
      if (!json_is_string(val) || (i == 0 && json_string_length(val) == 0)) {
        LOG(LOG_ERROR, "command[%zu] is not a %sstring", i, i == 0 ? "non-empty " : "");
        goto out;
      }
    }
    wd.argc = json_array_size(cmd);
    if (wd.argc > 0) {
      wd.argv = calloc(wd.argc + 1, sizeof(char *));
      if (!wd.argv) {
        rc = MUSTER_E_NOMEM;
        goto out;
      }
      json_array_foreach(cmd, i, val) {
        if (!(wd.argv[i] = strdup(json_string_value(val)))) {
          rc = MUSTER_E_NOMEM;
          goto out;
        }
      }
    }
  }

  if (env && !json_is_null(env) && (!json_is_object(env) || json_object_size(env) > WD_ENV_MAX)) {
    LOG(LOG_ERROR, "env is not an object of at most %d strings", WD_ENV_MAX);
    goto out;
  }
  /* The script sees workerd's own environment (the container's, or the
   * Slurm job's) with the controller's variables on top, less what is for
   * workerd alone: its token above all. */
  {
    extern char **environ;
    size_t own = 0;

    for (char **e = environ; *e; e++)
      own++;
    wd.envp = calloc(own + (env ? json_object_size(env) : 0) + 1, sizeof(char *));
    if (!wd.envp) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
    i = 0;
    for (char **e = environ; *e; e++) {
      size_t kl = strcspn(*e, "=");
      char name[256];

      if (kl >= sizeof(name) || env_workerd_only(*e))
        continue;
      memcpy(name, *e, kl);
      name[kl] = '\0';
      if (env && json_object_get(env, name))
        continue; /* the controller's value wins */
      if (!(wd.envp[i++] = strdup(*e))) {
        rc = MUSTER_E_NOMEM;
        goto out;
      }
    }
  }
  json_object_foreach(env, key, val) {
    size_t kl = strlen(key);
    size_t vl;
    char *kv;

    /* Values are never logged: they may hold the user's secret_env. */
    if (kl == 0 || strchr(key, '=') || !json_is_string(val)) {
      LOG(LOG_ERROR, "env entry \"%.64s\" is not NAME: string", key);
      goto out;
    }
    vl = json_string_length(val);
    if (!(kv = malloc(kl + vl + 2))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
    memcpy(kv, key, kl);
    kv[kl] = '=';
    memcpy(kv + kl + 1, json_string_value(val), vl + 1);
    wd.envp[i++] = kv;
  }

  if (cwd && !json_is_null(cwd)) {
    if (!json_is_string(cwd) || json_string_length(cwd) == 0) {
      LOG(LOG_ERROR, "cwd is not a non-empty string");
      goto out;
    }
    if (!(wd.cwd = strdup(json_string_value(cwd)))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
  }

  /* (absent from an older controller: nothing is checked before exec) */
  if (script && !json_is_null(script)) {
    if (!json_is_string(script) || json_string_length(script) == 0) {
      LOG(LOG_ERROR, "script is not a non-empty string");
      goto out;
    }
    if (!(wd.script = strdup(json_string_value(script)))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
  }

  /* Absent or null until the controller hands one out: exec is then refused.
   * Its value is never logged, not even when it is malformed. */
  if (xtok && !json_is_null(xtok)) {
    if (!json_is_string(xtok) || json_string_length(xtok) == 0 ||
        json_string_length(xtok) > WD_TOKEN_MAX ||
        strlen(json_string_value(xtok)) != json_string_length(xtok)) {
      LOG(LOG_ERROR, "exec_token is not a non-empty string of at most %d characters", WD_TOKEN_MAX);
      goto out;
    }
    if (!(wd.exec_token = strdup(json_string_value(xtok)))) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
  }
  rc = 0;
out:
  return rc;
}

/* This process's start time, or 0 if unknown: with the pid, how a local
 * controller knows this process from whatever gets its pid later. */
static unsigned long long self_start_time(void) {
  unsigned long long st;
  int zombie;

  return util_proc_stat(0, &st, &zombie) == 0 ? st : 0;
}

/* Registers this worker (address, hostname, exec port, pid) and reads the
 * assignment from the answer. Connection failures and 5xx answers are retried
 * with backoff for 10 minutes, since the controller may be restarting.
 * Returns 0; MUSTER_E_SHUTTING_DOWN if SIGTERM or SIGINT arrived meanwhile;
 * the matching MUSTER_E_* for a 4xx answer (the worker was stopped or is
 * unknown: its body is logged); MUSTER_E_TIMEOUT, MUSTER_E_PROTOCOL,
 * MUSTER_E_NOMEM. */
MUST_CHECK int register_worker(void) {
  char host[256];
  json_t *req = NULL;
  json_t *ans = NULL;
  json_error_t jerr;
  char *body = NULL;
  struct backoff b;
  long status;
  int rc;

  if (gethostname(host, sizeof(host)) != 0)
    host[0] = '\0';
  host[sizeof(host) - 1] = '\0';
  req = json_pack("{s:s, s:s, s:i, s:I, s:I, s:I}", "ip_address", wd.ip, "hostname", host,
                  "exec_port", wd.exec_port, "pid", (json_int_t)getpid(), "attempt",
                  (json_int_t)wd.attempt, "start_time", (json_int_t)self_start_time());
  if (!req || !(body = json_dumps(req, JSON_COMPACT))) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  backoff_init(&b);
  /* A controller that never answers is no better while registering than
   * later: the orphan timeout bounds this wait too. */
  if (b.give_up_ms > util_mono_ms() + wd.orphan_ms)
    b.give_up_ms = util_mono_ms() + wd.orphan_ms;
  for (;;) {
    rc = http_post("register", true, body, strlen(body), &status);
    if (rc == 0 && status == 200)
      break;
    if (rc == 0 && status >= 400 && status < 500) {
      LOG(LOG_ERROR, "the controller refused the registration (HTTP %ld): %.1000s", status,
          wd.answer);
      rc = status == 401   ? MUSTER_E_UNAUTHORIZED
           : status == 403 ? MUSTER_E_FORBIDDEN
           : status == 404 ? MUSTER_E_NOT_FOUND
           : status == 409 ? MUSTER_E_CONFLICT
                           : MUSTER_E_MALFORMED;
      goto out;
    }
    if (rc == 0 && status < 500) {
      LOG(LOG_ERROR, "unexpected HTTP %ld from the controller to the registration", status);
      rc = MUSTER_E_PROTOCOL;
      goto out;
    }
    if (rc == 0)
      LOG(LOG_DEBUG, "registration: HTTP %ld; retrying", status);
    else if (rc != MUSTER_E_UNREACHABLE)
      goto out;
    rc = backoff_wait(&b, true);
    if (rc == MUSTER_E_TIMEOUT)
      LOG(LOG_ERROR, "could not register within 10 minutes; giving up");
    if (rc)
      goto out;
  }
  ans = json_loadb(wd.answer, wd.answer_len, 0, &jerr);
  if (!ans) {
    LOG(LOG_ERROR, "the register answer is not JSON: %s", jerr.text);
    rc = MUSTER_E_PROTOCOL;
    goto out;
  }
  rc = assignment_parse(ans);
out:
  json_decref(ans);
  json_decref(req);
  free(body);
  return rc;
}
