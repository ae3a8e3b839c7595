/* api_worker.c: the calls a worker's muster-workerd makes (register,
 * heartbeat, exit, logs), each authenticated by that worker's own token.
 * See api_internal.h. */
#include "api_internal.h"

#include "backend.h"
#include "fault.h"
#include "job_secret.h"
#include "log.h"
#include "log_tail.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"
#include "validate.h"

#include "worker_spec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_LOG_FILE (64LL * 1024 * 1024)

/* Checks a worker-facing call: the token must be worker id's own.
 * On success returns 0 and *live is the worker if it is still live (NULL
 * if it is terminal). Called locked. */
static MUST_CHECK int worker_auth_locked(struct MHD_Connection *c, const char *id, struct lw **live,
                                         char *status, size_t statuslen) {
  const char *t = api_bearer(c);
  struct db_worker_info info;
  struct lw *w;
  int rc, ok;

  *live = NULL;
  if (!t)
    return MUSTER_E_UNAUTHORIZED;
  w = lw_find_locked(id);
  if (w) {
    if (!util_secret_equal(t, w->token))
      return MUSTER_E_FORBIDDEN;
    w->rotation_open = 0; /* the new token is in use: no retry with the old */
    *live = w;
    snprintf(status, statuslen, "%s", ws_name(w->status));
    return 0;
  }
  rc = db_worker_info(g.db, id, &info);
  if (rc)
    return rc == MUSTER_E_NOT_FOUND ? MUSTER_E_FORBIDDEN : rc;
  ok = util_secret_equal(t, info.token);
  snprintf(status, statuslen, "%s", info.status);
  db_worker_info_cleanup(&info);
  return ok ? 0 : MUSTER_E_FORBIDDEN;
}

/* 1 if t is the token worker w had before a register traded it for its
 * current one (job_rotated_token). */
static int token_traded(const struct lw *w, const char *t) {
  char derived[ROTATED_TOKEN_LEN + 1];
  int hit = t && job_rotated_token(g.api_token, w->id, t, derived) == 0 &&
            util_secret_equal(derived, w->token);

  explicit_bzero(derived, sizeof(derived));
  return hit;
}

/* The routes' check of the token from the request's head, before its body
 * is read (api_internal.h): the worker's own, or the one its register
 * traded (whose handler tells a retry from an intruder). */
static int worker_token_check(struct MHD_Connection *c, const char *id) {
  char status[16];
  struct lw *w;
  int rc;

  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  if (rc == MUSTER_E_FORBIDDEN && (w = lw_find_locked(id)) && token_traded(w, api_bearer(c)))
    rc = 0;
  state_unlock();
  return rc;
}

/* Worker w's token reached a process that is not its workerd: a second
 * registrant came with the token it traded (traded: 1), or its launcher
 * says its workerd got none (reg->token_lost). Fails the worker, saying
 * so, and answers the caller 409. Called locked; unlocks. */
static enum MHD_Result register_intruder_locked(struct MHD_Connection *c, struct lw *w,
                                                const struct register_req *reg, int traded,
                                                json_t *body) {
  char why[400], id[16];
  long first = w->reg_pid;
  int rc;

  snprintf(id, sizeof(id), "%s", w->id);
  if (!reg->token_lost && !traded)
    snprintf(why, sizeof(why),
             "pid %d registered as worker %s without trading the token its muster-workerd was "
             "handed (every Slurm step's workerd does): another process of its account read "
             "that token",
             reg->pid, id);
  else if (reg->token_lost)
    snprintf(why, sizeof(why),
             "worker %s's muster-workerd got no token on its stdin: another process of its "
             "account read the token from srun first%s",
             id, traded ? ", and registered as this worker" : "");
  else
    snprintf(why, sizeof(why),
             "two processes registered as worker %s: pid %ld, then pid %d with the token that "
             "was handed to its muster-workerd; another process of its account read that token",
             id, first, reg->pid);
  LOG(LOG_WARN, "%s", why);
  rc = sm_fail_locked(w, why);
  state_unlock();
  json_decref(body);
  if (rc)
    return api_respond_error(c, rc, NULL, "could not fail %s", id);
  return api_respond_error(c, MUSTER_E_CONFLICT, "token", "%s", why);
}

/* ---- worker-facing calls ---- */

static enum MHD_Result api_register(struct MHD_Connection *c, struct req *rq, const char *id) {
  struct db_worker_info info;
  struct db_fields f = DB_FIELDS_INIT;
  struct register_req reg;
  char status[16], detail[160], msg[256];
  const char *hostname, *ip, *field;
  json_t *body, *answer;
  struct lw *w;
  enum MHD_Result ret = MHD_NO;
  unsigned long long start_time;
  char ref[64], fresh[72];
  int rc, attempt;

  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = validate_register(body, &reg, &field, msg, sizeof(msg));
  if (rc) {
    json_decref(body);
    return api_respond_error(c, rc, field, "%s", msg);
  }
  f.exec_port = reg.exec_port ? reg.exec_port : -1; /* null when not given */
  f.pid = reg.pid ? reg.pid : -1;
  ip = reg.ip_address;
  hostname = reg.hostname;
  start_time = reg.start_time;
  attempt = reg.attempt;

  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  /* The token a register traded for a new one (rotate): its own workerd
   * asking again (the answer was lost), from the same pid and before the
   * new token was used, is answered; anyone else holding it read it where
   * the workerd was handed it, and the worker fails, saying so. */
  if (rc == MUSTER_E_FORBIDDEN && (w = lw_find_locked(id)) && token_traded(w, api_bearer(c))) {
    if (reg.token_lost || !reg.rotate || !w->rotation_open || f.pid <= 0 || w->reg_pid != f.pid)
      return register_intruder_locked(c, w, &reg, 1, body);
    rc = 0;
    snprintf(status, sizeof(status), "%s", ws_name(w->status));
  } else if (rc == 0 && w && reg.token_lost) {
    return register_intruder_locked(c, w, &reg, 0, body);
  } else if (rc == 0 && w && !reg.rotate && strcmp(g.backend->name, "slurm") == 0) {
    /* A Slurm worker's token travelled through srun: its own workerd
     * trades it at its first register, so one that keeps it is not. */
    return register_intruder_locked(c, w, &reg, 0, body);
  }
  if (rc) {
    state_unlock();
    json_decref(body);
    return api_respond_error(c, rc, NULL, "worker calls need that worker's own token");
  }
  if (!w || (w->status != WS_STARTING && w->status != WS_RUNNING && !lw_submitted(w))) {
    state_unlock();
    json_decref(body);
    return api_respond_error(c, MUSTER_E_CONFLICT, "status", "worker %s is %s; it cannot register",
                             id, status);
  }
  /* Exactly once: only the workerd of the committed attempt may run the
   * worker's script; any other (one started before a controller crash, say)
   * is refused and ends without running anything. */
  if (attempt != w->attempt || w->restart) {
    int current = w->attempt;
    state_unlock();
    json_decref(body);
    LOG(LOG_INFO, "%s: refused a registration of attempt %d (the current attempt is %d)", id,
        attempt, current);
    return api_respond_error(c, MUSTER_E_CONFLICT, "attempt",
                             "worker %s is on start attempt %d; this muster-workerd belongs to "
                             "attempt %d and must end",
                             id, current, attempt);
  }
  /* A registration of a worker that already runs is its own workerd asking
   * again (the first answer was lost): the same pid. Another process with
   * the same attempt (started twice by a backend) is refused. */
  if (w->status == WS_RUNNING && (!w->reg_pid || w->reg_pid != (f.pid > 0 ? f.pid : 0))) {
    state_unlock();
    json_decref(body);
    return api_respond_error(c, MUSTER_E_CONFLICT, "pid",
                             "worker %s already runs with another muster-workerd; this one must "
                             "end",
                             id);
  }
  if (w->status == WS_STARTING || lw_submitted(w)) {
    f.ip_address = ip;
    f.hostname = hostname;
    f.set_running_at = 1;
    f.set_heartbeat = 1;
    if (!w->ref_known && g.backend->ref_from_register &&
        g.backend->ref_from_register(f.pid, start_time, ref, sizeof(ref)) == 0)
      f.backend_ref = ref;
    snprintf(detail, sizeof(detail), "registered at %s", ip);
    rc = sm_begin();
    /* A queueing backend's worker may register before the backend's own
     * report of its start: it leaves the queue now. */
    if (!rc && w->status == WS_SCHEDULING)
      rc = sm_transition(w, WS_STARTING, NULL, "started (its muster-workerd registered)");
    if (!rc)
      rc = sm_transition(w, WS_RUNNING, &f, detail);
    /* A token that travelled (a Slurm step's, through srun) dies here: the
     * workerd goes on with one that never left this answer. */
    if (!rc && reg.rotate && job_rotated_token(g.api_token, id, w->token, fresh) != 0)
      rc = MUSTER_E_INTERNAL;
    if (!rc && reg.rotate)
      rc = db_worker_set_token(g.db, id, fresh);
    if (!rc)
      rc = sm_commit();
    else
      sm_rollback();
    if (!rc)
      FAULT_POINT("register_committed"); /* (a crash before the answer) */
    if (!rc && reg.rotate) {
      snprintf(w->token, sizeof(w->token), "%s", fresh);
      w->rotation_open = 1;
    }
    explicit_bzero(fresh, sizeof(fresh));
  }
  /* A second register (the answer to the first was lost) is answered the
   * same way and changes nothing. */
  if (!rc) {
    if (f.backend_ref)
      w->ref_known = 1;
    if (!w->reg_pid && f.pid > 0) {
      w->reg_pid = f.pid;
      w->log_end[0] = w->log_end[1] = 0; /* (its workerd's streams start) */
    }
    w->host_hash = util_fnv1a(hostname);
    sm_heartbeat_locked(w);
    rc = db_worker_info(g.db, id, &info);
  }
  if (rc) {
    state_unlock();
    json_decref(body);
    return api_respond_error(c, rc, NULL, "could not register %s", id);
  }
  answer =
      json_pack("{s:f, s:b, s:o, s:o, s:s, s:o}", "heartbeat_interval_seconds", hb_tell_locked(w),
                "host_beat", hb_host_beat_now(), "command", spec_command(&info), "env",
                spec_env(&info, ip, g.worker_url, g.api_token), "cwd",
                spec_cwd(&info, g.cfg.workdir), "script", spec_script(&info, g.cfg.workdir));
  {
    /* The session's exec credential: the worker checks it on every exec
     * request (docs/exec-protocol.md). */
    json_t *sess = db_session_json(g.db, info.session);
    json_t *tok = json_object_get(sess, "exec_token");
    if (json_is_string(tok))
      json_object_set(answer, "exec_token", tok);
    json_decref(sess);
  }
  if (reg.rotate)
    json_object_set_new(answer, "token", json_string(w->token));
  {
    /* The workerds of one user beat together (a vouch across users is
     * refused): each user's its own group on a host. */
    char group[16];

    snprintf(group, sizeof(group), "%08x", (unsigned)util_fnv1a(info.owner));
    json_object_set_new(answer, "host_beat_group", json_string(group));
  }
  db_worker_info_cleanup(&info);
  state_unlock();
  json_decref(body);
  return api_respond_json(c, MHD_HTTP_OK, answer);
}

/* The most siblings one heartbeat speaks for (a host's beat: its body's
 * "vouch"); the rest beat on their own. */
#define VOUCH_MAX 1000

/* Adds what w's workerd counts (a heartbeat's "exec_refused": the exec
 * connections it refused before their token held, since it started; older
 * workerds send none) to the controller's total. Called locked. */
static void note_exec_refused(struct lw *w, const json_t *refused) {
  json_int_t n = json_is_integer(refused) ? json_integer_value(refused) : -1;

  if (n >= 0 && (uint64_t)n > w->exec_refused) {
    g.exec_refused += (uint64_t)n - w->exec_refused;
    w->exec_refused = (uint64_t)n;
  }
}

/* What one vouch is answered: ok (with the interval told) or why not. */
struct vouch_result {
  const char *id; /* borrowed from the body */
  json_int_t pid;
  const char *why; /* NULL: vouched for */
  double interval;
  int64_t cover_ms;
};

/* Records the heartbeats that worker by's call carries for its host's other
 * workers (vouch: [{"id", "pid", "exec_refused"}]) into r (n of them, at
 * most VOUCH_MAX; the rest are left out). A worker is vouched for only if it
 * is running, of by's own user (a token speaks for nothing its user does
 * not own), registered from by's hostname by the workerd with that pid (not
 * an earlier attempt's, nor a beacon forged for one gone), and has used
 * the token its register traded for (until then, its own heartbeat must
 * close the old one's window). Called locked. */
static size_t vouch_locked(const struct lw *by, const json_t *vouch, struct vouch_result *r) {
  uint32_t seq = ++g.vouch_seq ? g.vouch_seq : ++g.vouch_seq; /* (0: no call's) */
  size_t i, n = 0;
  json_t *e;

  json_array_foreach(vouch, i, e) {
    const char *id = json_string_value(json_object_get(e, "id"));
    json_t *pid = json_object_get(e, "pid");
    struct lw *s;

    if (n == VOUCH_MAX)
      break;
    if (!id)
      continue;
    r[n] =
        (struct vouch_result){id, json_is_integer(pid) ? json_integer_value(pid) : 0, NULL, 0, 0};
    s = lw_find_locked(id);
    if (!s || s == by || s->owner != by->owner || s->host_hash != by->host_hash)
      r[n].why = "not a live worker of this worker's user and host";
    else if (s->status != WS_RUNNING)
      r[n].why = "not registered";
    else if (r[n].pid != (json_int_t)s->reg_pid)
      r[n].why = "not its registered muster-workerd";
    else if (s->rotation_open)
      r[n].why = "its new token is not used yet";
    else if (s->vouch_seq == seq)
      r[n].why = "vouched for already"; /* (named twice in one call) */
    if (!r[n].why) {
      s->vouch_seq = seq;
      sm_heartbeat_locked(s);
      note_exec_refused(s, json_object_get(e, "exec_refused"));
      g.hb_vouched++;
      r[n].interval = hb_tell_locked(s);
      r[n].cover_ms = hb_cover_ms_locked(s);
    }
    n++;
  }
  return n;
}

/* The answers to n vouches, by id (what each one's own heartbeat would
 * have been answered, its pid echoed; or why not); NULL when out of
 * memory. */
static json_t *vouched_json(const struct vouch_result *r, size_t n, int host_beat) {
  json_t *out = json_object();

  for (size_t i = 0; out && i < n; i++) {
    json_t *v = r[i].why
                    ? json_pack("{s:s, s:I}", "refused", r[i].why, "pid", r[i].pid)
                    : json_pack("{s:b, s:f, s:b, s:I, s:I}", "stop", 0,
                                "heartbeat_interval_seconds", r[i].interval, "host_beat", host_beat,
                                "pid", r[i].pid, "cover_ms", (json_int_t)r[i].cover_ms);
    if (json_object_set_new(out, r[i].id, v) != 0) {
      json_decref(out);
      out = NULL;
    }
  }
  return out;
}

static enum MHD_Result api_heartbeat(struct MHD_Connection *c, struct req *rq, const char *id) {
  char status[16];
  struct lw *w;
  int rc, host_beat;
  double interval;
  json_t *body = rq->len ? json_loadb(rq->body, rq->len, 0, NULL) : NULL;
  json_t *vouch = json_object_get(body, "vouch");
  json_t *answer, *vouched = NULL;
  size_t nv = json_is_array(vouch) ? json_array_size(vouch) : 0, n = 0;
  struct vouch_result *r = NULL;

  nv = nv > VOUCH_MAX ? VOUCH_MAX : nv;
  if (nv && !(r = calloc(nv, sizeof(*r)))) {
    json_decref(body);
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, "the controller is out of memory");
  }
  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  if (rc || (w && w->status == WS_STARTING)) {
    state_unlock();
    json_decref(body);
    free(r);
    if (rc)
      return api_respond_error(c, rc, NULL, "worker calls need that worker's own token");
    return api_respond_error(c, MUSTER_E_CONFLICT, "status", "worker %s has not registered", id);
  }
  g.hb_calls++;
  if (!w) {
    /* (a worker no longer live is told to stop, and nothing else) */
    state_unlock();
    json_decref(body);
    free(r);
    return api_respond_json(c, MHD_HTTP_OK, json_pack("{s:b}", "stop", 1));
  }
  sm_heartbeat_locked(w);
  note_exec_refused(w, json_object_get(body, "exec_refused"));
  interval = hb_tell_locked(w);
  host_beat = hb_host_beat_now();
  /* A host's agent speaks for the others once an interval: more often is
   * no honest workerd's, and each vouch costs a lookup under the lock. */
  if (nv && util_mono_ms() - w->last_vouch_ms >= w->hb_interval_ms / 2) {
    w->last_vouch_ms = util_mono_ms();
    n = vouch_locked(w, vouch, r);
  }
  state_unlock();
  /* (the answers are written outside the lock) */
  if (n && !(vouched = vouched_json(r, n, host_beat))) {
    json_decref(body);
    free(r);
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, "the controller is out of memory");
  }
  answer = json_pack("{s:b, s:f, s:b}", "stop", 0, "heartbeat_interval_seconds", interval,
                     "host_beat", host_beat);
  json_decref(body);
  free(r);
  if (answer && vouched)
    json_object_set_new(answer, "vouched", vouched);
  else
    json_decref(vouched);
  return api_respond_json(c, MHD_HTTP_OK, answer);
}

void api_log_end_path(const char *id, char *buf, size_t size) {
  snprintf(buf, size, "%s/logs/%s.end", g.cfg.state_dir, id);
}

/* Records that worker id's workerd has shipped all its output, and wakes
 * its followed logs: one that waits after the worker's end for its last
 * output ends once that output is read. Called unlocked (the file is made
 * without the state lock). */
static void log_mark_complete(const char *id) {
  char path[700];
  int fd;

  api_log_end_path(id, path, sizeof(path));
  fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    LOG(LOG_WARN, "could not create %s: %s", path, strerror(errno));
  else
    close(fd);
  state_lock();
  streams_wake_logs_locked(id);
  state_unlock();
}

/* The failure of a script that ran and failed, ex->failure, followed by
 * the last lines of its stderr (a traceback's last line says more than an
 * exit code): written to buf (size bytes) and returned, or ex->failure
 * itself if its stderr is empty or has nothing to add. The log is whole:
 * workerd ships its last output before its exit report. A log cut at its
 * cap has no end to quote: the failure says so instead. An outside stop
 * quotes nothing (the cause is the stop, and a queueing backend's words
 * replace it), nor does a command that could not start (its stderr is
 * workerd's sentence about that, the failure already). Called unlocked. */
static const char *failure_with_tail(const char *id, const struct exit_req *ex, char *buf,
                                     size_t size) {
  char path[700], tail[LOG_TAIL_MAX_BYTES + 1];
  int capped;

  if (!ex->failure[0] ||
      strncmp(ex->failure, MUSTER_OUTSIDE_STOP, strlen(MUSTER_OUTSIDE_STOP)) == 0 ||
      api_log_path(id, "stderr", path, sizeof(path)) != 0)
    return ex->failure;
  if (log_tail_read(path, MAX_LOG_FILE, &capped, tail) == 0) {
    if (!capped)
      return ex->failure;
    snprintf(buf, size, "%s; its stderr passed %lld MiB, so its last lines were not kept",
             ex->failure, MAX_LOG_FILE / (1024 * 1024));
    return buf;
  }
  if (strstr(tail, ex->failure))
    return ex->failure;
  snprintf(buf, size, "%s; its stderr ended with:\n%s", ex->failure, tail);
  return buf;
}

static enum MHD_Result api_exit(struct MHD_Connection *c, struct req *rq, const char *id) {
  struct db_fields f = DB_FIELDS_INIT;
  struct exit_req ex;
  char status[16], msg[256];
  char failure[sizeof(ex.failure) + 32 + LOG_TAIL_MAX_BYTES];
  const char *field;
  json_t *body;
  enum MHD_Result ret = MHD_NO;
  enum wstatus to;
  struct lw *w;
  int rc, authed, live;

  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = validate_exit(body, &ex, &field, msg, sizeof(msg));
  if (rc) {
    json_decref(body);
    return api_respond_error(c, rc, field, "%s", msg);
  }
  /* What the report leaves out stays null (-1 is "not given" here). */
  f.exit_code = ex.has_exit_code ? ex.exit_code : -1;
  f.signal = ex.signal ? ex.signal : -1;
  to = ex.failure[0] ? WS_FAILED : WS_SUCCEEDED;
  /* The log is read unlocked, and only for its worker's own report of an
   * end that changes something (a live worker): checked here, and again
   * below, where the worker may have ended meanwhile. */
  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  live = !rc && w;
  state_unlock();
  f.failure = !ex.failure[0] ? NULL
              : live         ? failure_with_tail(id, &ex, failure, sizeof(failure))
                             : ex.failure;

  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  /* workerd reports its end only after shipping its last output, which
   * may come after the end was recorded here (a stopped command's last
   * words): the report, whatever it changes, says that the log is whole
   * (log_mark_complete(), once unlocked). */
  authed = rc == 0;
  /* Stopped from outside muster: a queueing backend (Slurm) is about to
   * say why in its own words (a cancel, a time limit), which tells the
   * user more than the workerd's SIGTERM. Its report is awaited for a few
   * seconds; the workerd's words are the failure if none comes. */
  if (!rc && w && g.backend->queues && !w->outside_why &&
      strncmp(ex.failure, MUSTER_OUTSIDE_STOP, strlen(MUSTER_OUTSIDE_STOP)) == 0) {
    w->outside_why = strdup(ex.failure);
    w->outside_until_ms = util_mono_ms() + (w->ending ? OUTSIDE_ENDING_WAIT_MS : OUTSIDE_WAIT_MS);
    w->outside_signal = ex.signal;
    if (w->outside_why) {
      state_unlock();
      json_decref(body);
      log_mark_complete(id);
      return api_respond_json(c, MHD_HTTP_OK, json_object());
    }
  }
  if (!rc && w)
    rc = sm_finish_locked(w, to, &f, f.failure ? f.failure : "the script exited with code 0",
                          BACKEND_KILL_LATER);
  state_unlock();
  json_decref(body);
  if (authed)
    log_mark_complete(id);
  if (rc)
    return api_respond_error(c, rc, NULL, "could not record the end of %s", id);
  /* An end reported after the worker already ended (stopped, or failed)
   * changes nothing. */
  return api_respond_json(c, MHD_HTTP_OK, json_object());
}

int api_log_path(const char *id, const char *stream, char *buf, size_t size) {
  if (!stream)
    stream = "stdout";
  if (strcmp(stream, "stdout") != 0 && strcmp(stream, "stderr") != 0)
    return MUSTER_E_INVALID;
  snprintf(buf, size, "%s/logs/%s.%s", g.cfg.state_dir, id, stream);
  return 0;
}

/* Writes all n bytes of data to fd. Returns 0, or -1 with errno set. */
static int write_all(int fd, const char *data, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, data, n);

    if (k < 0 && errno == EINTR)
      continue;
    if (k == 0)
      errno = EIO;
    if (k <= 0)
      return -1;
    data += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Appends the n bytes of data to the log open as fd, up to the cap of
 * MAX_LOG_FILE bytes. The chunk that crosses the cap is cut there and
 * followed by one note saying that the rest is dropped; past it, nothing
 * more is written. The file alone says where it stands (a size beyond the
 * cap is the cap plus that note), so the note is written once per stream
 * whatever comes later, a controller restart included. The caller holds an
 * exclusive lock on fd, so that concurrent appends see each other's size.
 * Returns 0, or -1 with errno set. */
static int log_append_capped(int fd, const char *data, size_t n) {
  static const char note[] = "\n[muster: log truncated at 64 MiB]\n";
  struct stat st;
  size_t room;

  if (fstat(fd, &st) != 0)
    return -1;
  if (st.st_size > MAX_LOG_FILE || n == 0)
    return 0; /* the note is there: the rest is dropped */
  room = (size_t)(MAX_LOG_FILE - st.st_size);
  if (n <= room)
    return write_all(fd, data, n);
  if (write_all(fd, data, room) != 0)
    return -1;
  return write_all(fd, note, sizeof(note) - 1);
}

/* Where worker id's stream k (0 stdout, 1 stderr) has been delivered up to
 * (lw.log_end), or 0 if it is not live. */
static uint64_t log_end_of(const char *id, int k) {
  struct lw *w;
  uint64_t end;

  state_lock();
  w = lw_find_locked(id);
  end = w ? w->log_end[k] : 0;
  state_unlock();
  return end;
}

/* Records that worker id's stream k has been delivered up to end (when
 * end is not 0), and wakes the followers of its log: one hold of the state
 * lock, taken while the log's flock is held, so that a POST of the same
 * bytes that waits for the flock finds end. */
static void log_appended(const char *id, int k, uint64_t end) {
  struct lw *w;

  state_lock();
  w = lw_find_locked(id);
  if (w && end > w->log_end[k])
    w->log_end[k] = end;
  streams_wake_logs_locked(id);
  state_unlock();
}

static enum MHD_Result api_log_append(struct MHD_Connection *c, struct req *rq, const char *id) {
  const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
  const char *pos_text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "pos");
  const char *gap_text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "gap");
  char path[700], status[16];
  struct stat st;
  struct lw *w;
  long pos = -1, gap = -1;
  size_t skip = 0;
  int rc, fd, k = stream && strcmp(stream, "stderr") == 0;

  if (api_log_path(id, stream, path, sizeof(path)) != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "stream", "stream must be stdout or stderr");
  if (pos_text && util_parse_long(pos_text, 0, LONG_MAX, &pos) != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "pos",
                             "pos must be a whole number: the position in the stream of the "
                             "body's first byte");
  if (gap_text && (pos_text || util_parse_long(gap_text, 0, LONG_MAX, &gap) != 0))
    return api_respond_error(c, MUSTER_E_INVALID, "gap",
                             "gap must be a whole number, without pos: the position in the "
                             "stream where the bytes that a notice says were dropped end");
  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  state_unlock();
  if (rc)
    return api_respond_error(c, rc, NULL, "worker calls need that worker's own token");
  /* Tests: a controller that takes its time over each log POST. */
  FAULT_POINT("log_append_slow");
  fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0)
    return api_respond_error(c, MUSTER_E_IO, NULL, "could not open the log: %s", strerror(errno));
  /* A runaway worker must not fill the disk: the log stops at the cap.
   * With pos, what an earlier POST of the same bytes delivered (one of the
   * two had its answer come after the workerd gave up waiting) is left out,
   * and a notice of dropped bytes (gap) whose gap an earlier one closed;
   * the lock on the file orders them. A write that fails leaves nothing,
   * or the POST sent again would add it twice. */
  if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return api_respond_error(c, MUSTER_E_IO, NULL, "could not lock the log: %s", strerror(err));
  }
  if (pos >= 0 || gap >= 0) {
    uint64_t end = log_end_of(id, k), at = (uint64_t)(pos >= 0 ? pos : gap);

    if (gap >= 0 && end >= at)
      skip = rq->len;
    else if (pos >= 0 && end > at)
      skip = end - at < rq->len ? (size_t)(end - at) : rq->len;
  }
  if (log_append_capped(fd, rq->len ? rq->body + skip : rq->body, rq->len - skip) != 0) {
    int err = errno;

    if (ftruncate(fd, st.st_size) != 0)
      LOG(LOG_ERROR, "%s: could not take a failed write out of %s: %s", id, path, strerror(errno));
    close(fd);
    return api_respond_error(c, MUSTER_E_IO, NULL, "could not append to the log: %s",
                             strerror(err));
  }
  log_appended(id, k, pos >= 0 ? (uint64_t)pos + rq->len : gap >= 0 ? (uint64_t)gap : 0);
  close(fd);
  /* Tests: its answer comes late (after the workerd gave up waiting). */
  FAULT_POINT("log_appended_answer_slow");
  if (skip > 0 && gap >= 0)
    LOG(LOG_INFO,
        "%s: left out a notice of dropped %s bytes whose gap an earlier POST closed (one of the "
        "two was answered after its workerd gave up waiting)",
        id, k ? "stderr" : "stdout");
  else if (skip > 0)
    LOG(LOG_INFO,
        "%s: left out %zu bytes of %s that an earlier POST of the same bytes delivered (one of "
        "the two was answered after its workerd gave up waiting)",
        id, skip, k ? "stderr" : "stdout");
  return api_respond_empty(c, MHD_HTTP_NO_CONTENT);
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_worker_routes[] = {
    /* The worker's own calls carry its token, not the client's. */
    {"POST", "/api/v1/workers/{id}/register", AUTH_WORKER, api_register, worker_token_check},
    {"POST", "/api/v1/workers/{id}/heartbeat", AUTH_WORKER, api_heartbeat, worker_token_check},
    {"POST", "/api/v1/workers/{id}/exit", AUTH_WORKER, api_exit, worker_token_check},
    {"POST", "/api/v1/workers/{id}/logs", AUTH_WORKER, api_log_append, worker_token_check},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
