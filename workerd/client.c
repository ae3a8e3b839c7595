/*
 * client.c: muster-workerd's client of the controller: registration and
 * heartbeats, as steps the main loop drives (the calls themselves are
 * ctl_call.c's and never block).
 *
 * Registration sends the worker's address and reads its assignment (the
 * command, environment, cwd, exec token) into wd; it is retried with a
 * backoff of 100 ms doubling to 5 s, for the orphan timeout (backoff_next()). A
 * heartbeat's answer may stop the worker (hb_step()). The address itself,
 * unless MUSTER_BIND_IP gives it, is the one that packets toward the
 * controller leave from (ip_toward_controller()), searched for with the same
 * backoff, waited for in poll() on the self-pipe (backoff_wait()).
 */
#include "envlists.h"
#include "workerd.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <inttypes.h>
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
  struct hc_target to;
  struct addrinfo hints;
  struct addrinfo *res = NULL;
  socklen_t ip_size = (socklen_t)size;
  int fd = -1;
  int gai;
  int rc;

  if (hc_target_parse(wd.url, &to) != 0) {
    LOG(LOG_ERROR, "MUSTER_CONTROLLER_URL is not a valid URL with a host and port");
    return MUSTER_E_INVALID;
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  gai = getaddrinfo(to.host, to.port, &hints, &res);
  if (gai != 0) {
    LOG(LOG_WARN, "cannot resolve the controller's host %s: %s", to.host, gai_strerror(gai));
    return MUSTER_E_UNREACHABLE;
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
    LOG(LOG_WARN, "no route toward the controller's host %s", to.host);
  if (fd >= 0)
    close(fd);
  freeaddrinfo(res);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Backoff                                                                  */

/* Starts a backoff that gives up 10 minutes from now (3 s in a test that
 * must see it give up, or outlast it). */
void backoff_init(struct backoff *b) {
  b->give_up_ms =
      util_mono_ms() + (FAULT_FAILS("workerd_retry_total_3s") ? 3000 : WD_RETRY_TOTAL_MS);
  b->delay_ms = WD_RETRY_FIRST_MS;
}

/* Sleeps for the next delay of b (100 ms, doubling up to 5 s), never past
 * its end. Returns 0 when it is time to try again, MUSTER_E_TIMEOUT when the
 * 10 minutes are over, or MUSTER_E_SHUTTING_DOWN as soon as SIGTERM or SIGINT
 * arrives (it is used before anything else runs). */
MUST_CHECK int backoff_wait(struct backoff *b) {
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
      if (term)
        return MUSTER_E_SHUTTING_DOWN;
    }
  }
  return 0;
}

/* When the next try of b is due after a failure at now (100 ms, doubling
 * up to 5 s), or INT64_MAX once its time is up. */
int64_t backoff_next(struct backoff *b, int64_t now) {
  int64_t at = now + b->delay_ms;

  if (now >= b->give_up_ms)
    return INT64_MAX;
  b->delay_ms = b->delay_ms * 2 > WD_RETRY_MAX_MS ? WD_RETRY_MAX_MS : b->delay_ms * 2;
  return at < b->give_up_ms ? at : b->give_up_ms;
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
  wd.host_beat = json_is_true(json_object_get(ans, "host_beat"));
  {
    const char *g = json_string_value(json_object_get(ans, "host_beat_group"));

    /* (hex, or "0" from a controller that sends none) */
    snprintf(wd.host_group, sizeof(wd.host_group), "%s",
             g && strlen(g) < sizeof(wd.host_group) && strspn(g, "0123456789abcdef") == strlen(g)
                 ? g
                 : "0");
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

/* The registration in progress: its body, its slot, its backoff. */
static struct {
  char *body;
  struct call call;
  struct backoff backoff;
  int64_t retry_at_ms; /* the next try; INT64_MAX while one is in flight */
} reg;

/* Prepares the registration: the worker's address, hostname, exec port and
 * pid, tried by register_step() until the controller answers, with backoff
 * for the orphan timeout, since the controller may be restarting. Returns 0 or MUSTER_E_NOMEM. */
MUST_CHECK int register_begin(void) {
  char host[256];
  json_t *req;

  if (gethostname(host, sizeof(host)) != 0)
    host[0] = '\0';
  host[sizeof(host) - 1] = '\0';
  req = json_pack("{s:s, s:s, s:i, s:I, s:I, s:I, s:b}", "ip_address", wd.ip, "hostname", host,
                  "exec_port", wd.exec_port, "pid", (json_int_t)getpid(), "attempt",
                  (json_int_t)wd.attempt, "start_time", (json_int_t)self_start_time(), "rotate",
                  /* a test plays a thief that keeps the token it read */
                  wd.rotate && !FAULT_FAILS("register_keeps_token"));
  reg.body = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  if (!reg.body)
    return MUSTER_E_NOMEM;
  backoff_init(&reg.backoff);
  /* A controller that does not answer is worth the same patience while
   * registering as later: the orphan timeout (10 minutes by default). */
  reg.backoff.give_up_ms = util_mono_ms() + wd.orphan_ms;
  reg.retry_at_ms = 0;
  return 0;
}

/* The answer to the registration's call, taken: REG_OK with the assignment
 * in wd, REG_BUSY when it must be tried again, or REG_FAILED with *rc (the
 * matching MUSTER_E_* for a 4xx answer: the worker was stopped or is unknown,
 * its body logged; MUSTER_E_PROTOCOL, MUSTER_E_NOMEM). */
static enum reg_result register_answer(int64_t now, int *rc) {
  json_error_t jerr;
  json_t *ans;
  long status;

  *rc = call_take(&reg.call, &status);
  if (*rc == 0 && status >= 400 && status < 500) {
    LOG(LOG_ERROR, "the controller refused the registration (HTTP %ld): %.1000s", status,
        reg.call.answer ? reg.call.answer : "");
    *rc = status == 401   ? MUSTER_E_UNAUTHORIZED
          : status == 403 ? MUSTER_E_FORBIDDEN
          : status == 404 ? MUSTER_E_NOT_FOUND
          : status == 409 ? MUSTER_E_CONFLICT
                          : MUSTER_E_MALFORMED;
    return REG_FAILED;
  }
  if (*rc == 0 && status != 200 && status < 500) {
    LOG(LOG_ERROR, "unexpected HTTP %ld from the controller to the registration", status);
    *rc = MUSTER_E_PROTOCOL;
    return REG_FAILED;
  }
  if (*rc == 0 && status >= 500)
    LOG(LOG_DEBUG, "registration: HTTP %ld; retrying", status);
  if (call_unanswered(*rc, status)) {
    reg.retry_at_ms = backoff_next(&reg.backoff, now);
    if (reg.retry_at_ms != INT64_MAX) {
      *rc = 0; /* (tried again: no error, or the caller's loop would end) */
      return REG_BUSY;
    }
    LOG(LOG_ERROR, "could not register within MUSTER_ORPHAN_TIMEOUT (%" PRId64 " s); giving up",
        wd.orphan_ms / 1000);
    *rc = MUSTER_E_TIMEOUT;
    return REG_FAILED;
  }
  if (*rc)
    return REG_FAILED;
  ans = json_loadb(reg.call.answer ? reg.call.answer : "", reg.call.answer_len, 0, &jerr);
  if (!ans) {
    LOG(LOG_ERROR, "the register answer is not JSON: %s", jerr.text);
    *rc = MUSTER_E_PROTOCOL;
    return REG_FAILED;
  }
  *rc = assignment_parse(ans);
  /* A token that travelled (srun held it a while) is traded at
   * registration for one that never left the controller's answer. */
  if (!*rc && wd.rotate) {
    const char *tok = json_string_value(json_object_get(ans, "token"));
    *rc = tok ? calls_set_token(tok) : MUSTER_E_PROTOCOL;
    if (*rc)
      LOG(LOG_ERROR, "the register answer has no usable new token");
  }
  json_decref(ans);
  return *rc ? REG_FAILED : REG_OK;
}

/* Moves the registration on: starts a try when one is due, takes its answer
 * when it came. Never waits. Returns REG_BUSY, REG_OK (the assignment is in
 * wd) or REG_FAILED with *rc as register_answer() says. */
enum reg_result register_step(int64_t now, int *rc) {
  *rc = 0;
  if (reg.call.state == CALL_DONE)
    return register_answer(now, rc);
  if (reg.call.state == CALL_IDLE && now >= reg.retry_at_ms) {
    /* (tests: a workerd that lives on, unregistered, its network set up) */
    FAULT_POINT("workerd_before_register");
    *rc = call_start(&reg.call, "register", true, reg.body, strlen(reg.body), WD_CALL_TIMEOUT_MS);
    if (*rc)
      return REG_FAILED;
  }
  return REG_BUSY;
}

/* When register_step() must next run if no socket moves before. */
int64_t register_deadline(void) {
  return reg.call.state == CALL_IDLE ? reg.retry_at_ms : INT64_MAX;
}

/* Ends the registration, whatever its state: its call abandoned, its body
 * freed. */
void register_cancel(void) {
  call_cancel(&reg.call);
  free(reg.body);
  reg.body = NULL;
}

/* ------------------------------------------------------------------------ */
/* Heartbeats                                                               */

static struct call hb_call;
static char *hb_body; /* the body of the heartbeat in flight */

/* A heartbeat's answer may carry a new interval: the controller stretches
 * it as the number of live workers grows, so that they send at most its
 * --heartbeat-rate heartbeats a second, and shortens it as they end. The
 * next heartbeat is due that long after this one. Anything else keeps the
 * interval as it was (an older controller sends none). */
static void hb_adopt_interval(const json_t *v) {
  double s = json_number_value(v);

  if (!json_is_number(v) || !(s >= 0.1 && s <= 3600))
    return;
  if ((int64_t)(s * 1000) != wd.hb_interval_ms)
    LOG(LOG_DEBUG, "heartbeat interval now %.1f s", s);
  wd.hb_interval_ms = (int64_t)(s * 1000);
}

/* Whether the controller has been away (no answer of its own to any call)
 * longer than MUSTER_ORPHAN_TIMEOUT, counted from the first call that got
 * none: the worker must end (said in the log). */
static bool orphan_expired(int64_t now) {
  if (!wd.away_since_ms || now - wd.away_since_ms <= wd.orphan_ms)
    return false;
  LOG(LOG_ERROR,
      "no answer from the controller itself for %" PRId64 " s (MUSTER_ORPHAN_TIMEOUT); "
      "ending this worker",
      (now - wd.away_since_ms) / 1000);
  return true;
}

/* The heartbeat's answer: a stop, or an answer saying that the controller
 * no longer knows this worker, or that it was not heard from for too long. A
 * controller that cannot be reached is not an error: the next interval tries
 * again, and succeeding is all it takes to re-attach. */
static enum hb_result hb_answer(int64_t now) {
  enum hb_result res = HB_NONE;
  json_t *ans = NULL;
  json_t *stop;
  long status;
  int rc = call_take(&hb_call, &status);

  if (call_unanswered(rc, status)) {
    /* (0 away: an answer to another call came since) */
    if (orphan_expired(now))
      return HB_STOP_SILENT;
    LOG(LOG_DEBUG, "heartbeat not delivered (%s); next one in %" PRId64 " ms",
        rc == MUSTER_E_TOO_LARGE ? "an answer past 1 MiB"
        : rc                     ? "unreachable"
                                 : "server error",
        wd.hb_interval_ms);
    return HB_NONE;
  }
  if (rc) {
    /* (out of memory here: the controller may well have answered) */
    LOG(LOG_WARN, "heartbeat failed: %s", muster_strerror(rc));
    return HB_NONE;
  }
  if (status == 401 || status == 403 || status == 404 || status == 409) {
    LOG(LOG_INFO, "the controller no longer runs this worker (HTTP %ld); stopping", status);
    return HB_STOP_SILENT;
  }
  if (status != 200) {
    LOG(LOG_WARN, "unexpected HTTP %ld to a heartbeat", status);
    return HB_NONE;
  }
  ans = json_loadb(hb_call.answer ? hb_call.answer : "", hb_call.answer_len, 0, NULL);
  hb_adopt_interval(json_object_get(ans, "heartbeat_interval_seconds"));
  if (json_is_boolean(json_object_get(ans, "host_beat")))
    wd.host_beat = json_is_true(json_object_get(ans, "host_beat"));
  host_beat_answered(json_object_get(ans, "vouched"));
  stop = json_object_get(ans, "stop");
  if (!json_is_boolean(stop)) {
    LOG(LOG_WARN, "the heartbeat answer has no boolean \"stop\"");
  } else if (json_is_true(stop)) {
    LOG(LOG_INFO, "the controller asked this worker to stop");
    res = HB_STOP_QUIET;
  } else {
    LOG(LOG_DEBUG, "heartbeat delivered");
  }
  json_decref(ans);
  return res;
}

/* Moves heartbeats on: starts one when wd.next_hb_ms has come and none is
 * in flight, takes the answer of one that ended (the next is due an
 * interval after it). Never waits. Returns what the answer decides. */
enum hb_result hb_step(int64_t now) {
  enum hb_result res;

  if (hb_call.state == CALL_DONE) {
    res = hb_answer(now); /* (which may change the interval) */
    wd.next_hb_ms = now + wd.hb_interval_ms;
    calls_keep_none();
    return res;
  }
  res = host_beat_step(now, ex_refused());
  if (res != HB_NONE)
    return res;
  if (hb_call.state == CALL_IDLE && now >= wd.next_hb_ms) {
    json_t *body, *vouch;

    if (host_beat_covered(now)) {
      /* (the host's agent answered for this worker lately: its own beat
       * is due when that cover ends, unless a new answer renews it) */
      int64_t until = host_beat_covered_until();

      wd.next_hb_ms = now + wd.hb_interval_ms < until ? now + wd.hb_interval_ms : until;
      return HB_NONE;
    }
    body = json_pack("{s:I}", "exec_refused", (json_int_t)ex_refused());
    vouch = host_beat_vouch();
    if (body && vouch && json_array_size(vouch) > 0)
      json_object_set(body, "vouch", vouch);
    json_decref(vouch);
    /* (the body is sent while the call is in flight: it stays) */
    free(hb_body);
    hb_body = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!hb_body || call_start(&hb_call, "heartbeat", true, hb_body, strlen(hb_body),
                               WD_CALL_TIMEOUT_MS) != 0) {
      /* (out of memory: no heartbeat goes, and none fails, so the time
       * away is judged here, or a controller gone meanwhile would keep
       * this worker for ever) */
      wd.next_hb_ms = now + wd.hb_interval_ms;
      if (orphan_expired(now))
        return HB_STOP_SILENT;
    } else {
      wd.next_hb_ms = INT64_MAX; /* set when it ends */
    }
  }
  return HB_NONE;
}

/* Abandons a heartbeat in flight: the worker is ending, its answer moot;
 * and leaves the host's heartbeat. */
void hb_cancel(void) {
  call_cancel(&hb_call);
  free(hb_body);
  hb_body = NULL;
  host_beat_leave();
}
