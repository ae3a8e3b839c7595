/* api_claim.c: POST /api/v1/workers/{id}/claim, a queueing backend's job
 * claiming its workers' tokens with its one secret (job_secret.h).
 *
 * A Slurm job carries no worker's token: anything in its script or
 * environment can be read by every step of the job (the batch script in
 * slurmd's spool, /proc/PID/environ of its processes), and the steps all
 * run as one account. Its first process (muster-workerd --job) claims the
 * tokens before any step runs, and hands each step's muster-workerd its
 * own through a pipe. The claim mints new tokens, derived from the secret
 * and a claim key the launcher picked at random and sends with each try:
 * the same claim made again with the same key (its answer lost) gets the
 * same ones, until the first of them is traded by its worker's register;
 * any other claim with the secret gets nothing, so a step that reads it
 * gets nothing from it, and a thief who claims first fails the launcher's
 * claim, visibly. See api_internal.h. */
#include "api_internal.h"

#include "fault.h"
#include "job_secret.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLAIM_MAX 1024      /* workers of one job (a launch's most) */
#define CLAIM_WARN_MS 10000 /* at most one refusal logged in this */

/* One worker named by a claim, with what the controller knows of it. */
struct claimed {
  char id[16];
  int attempt;     /* as the job names it */
  char token[72];  /* its token now */
  struct lw *live; /* live, of the job's attempt: gets a new token */
  char fresh[72];
};

/* Fills cl[0..n-1] from the body's "workers" ([{"id", "attempt"}, ...], the
 * first being the path's id). Returns 0 or MUSTER_E_INVALID with *why. */
static int claim_parse(json_t *body, const char *id, struct claimed **out, int *n,
                       const char **why) {
  json_t *ws = json_object_get(body, "workers"), *e;
  size_t i;

  *out = NULL;
  *n = 0;
  if (!json_is_array(ws) || json_array_size(ws) < 1 || json_array_size(ws) > CLAIM_MAX) {
    *why = "workers must be a list of 1 to 1024 {\"id\", \"attempt\"}";
    return MUSTER_E_INVALID;
  }
  *out = calloc(json_array_size(ws), sizeof(**out));
  if (!*out)
    return MUSTER_E_NOMEM;
  json_array_foreach(ws, i, e) {
    const char *wid = json_string_value(json_object_get(e, "id"));
    json_t *a = json_object_get(e, "attempt");

    if (!wid || strlen(wid) >= sizeof((*out)[i].id) || !json_is_integer(a) ||
        json_integer_value(a) < 1 || json_integer_value(a) > (1 << 30) ||
        (i == 0 && strcmp(wid, id) != 0)) {
      *why = "each of workers is {\"id\": a worker id, \"attempt\": its start attempt}, the "
             "first the path's";
      free(*out);
      *out = NULL;
      return MUSTER_E_INVALID;
    }
    snprintf((*out)[i].id, sizeof((*out)[i].id), "%s", wid);
    (*out)[i].attempt = (int)json_integer_value(a);
  }
  *n = (int)i;
  return 0;
}

/* The body's "claim_key" into key (claim_key.n + 1 bytes): none gives "",
 * else 32 to 128 hex digits, which the launcher picks at random and keeps
 * for its tries. Returns 0 or MUSTER_E_INVALID. */
static int claim_key_parse(json_t *body, char *key, size_t size) {
  json_t *v = json_object_get(body, "claim_key");
  const char *s = json_string_value(v);
  size_t len = s ? strlen(s) : 0;

  key[0] = '\0';
  if (!v)
    return 0;
  if (!s || len < 32 || len > 128 || len >= size || strspn(s, "0123456789abcdef") != len)
    return MUSTER_E_INVALID;
  memcpy(key, s, len + 1);
  return 0;
}

/* Whether secret's claim was made already with claim_key, one of 32 hex
 * digits or more, and is made again (its answer lost: a reset, a timeout,
 * a controller that crashed before answering): every worker named live on
 * the job's attempt, one at least, still holds the token that claim gave
 * it (derived from both), which no register has traded yet. Only the
 * launcher knows its key: anyone else who read the secret gets nothing.
 * Puts those tokens in cl[].fresh. Called locked. */
static int claimed_before_locked(const char *secret, const char *claim_key, struct claimed *cl,
                                 int n) {
  int live = 0, same = strlen(claim_key) >= 32;

  for (int i = 0; i < n && same; i++) {
    if (!cl[i].live)
      continue;
    live++;
    if (job_claimed_token(g.api_token, secret, claim_key, cl[i].id, cl[i].attempt, cl[i].fresh) !=
            0 ||
        !util_secret_equal(cl[i].token, cl[i].fresh))
      same = 0;
  }
  return live > 0 && same;
}

/* Checks the job's secret against the workers' current tokens, and mints
 * new tokens for those live on the job's attempt (database, then memory),
 * derived from the secret; or gives the same ones to the same claim made
 * again before any was traded (*again set). Returns 0, MUSTER_E_FORBIDDEN
 * (not this job's secret, or claimed already and since registered), or
 * another error. Called locked. */
static int claim_locked(const char *secret, const char *claim_key, struct claimed *cl, int n,
                        int *again) {
  struct job_member *m = calloc((size_t)n, sizeof(*m));
  char want[JOB_SECRET_LEN + 1];
  int rc = 0;

  if (!m)
    return MUSTER_E_NOMEM;
  /* (no database read or digest is spent on a request nobody has
   * authenticated unless one of its workers is live: a memory lookup) */
  {
    int any = 0;

    for (int i = 0; i < n && !any; i++)
      any = lw_find_locked(cl[i].id) != NULL;
    if (!any) {
      free(m);
      return MUSTER_E_FORBIDDEN;
    }
  }
  for (int i = 0; i < n && !rc; i++) {
    struct lw *w = lw_find_locked(cl[i].id);
    struct db_worker_info info;

    if (w) {
      snprintf(cl[i].token, sizeof(cl[i].token), "%s", w->token);
      if (w->attempt == cl[i].attempt && !w->restart)
        cl[i].live = w;
    } else if ((rc = db_worker_info(g.db, cl[i].id, &info)) == 0) {
      snprintf(cl[i].token, sizeof(cl[i].token), "%s", info.token);
      db_worker_info_cleanup(&info);
    } else if (rc == MUSTER_E_NOT_FOUND) {
      rc = MUSTER_E_FORBIDDEN;
    }
    m[i] = (struct job_member){cl[i].id, cl[i].attempt, cl[i].token};
  }
  *again = 0;
  if (!rc && (job_secret(m, n, want) != 0 || !util_secret_equal(secret, want))) {
    *again = claimed_before_locked(secret, claim_key, cl, n);
    rc = *again ? 0 : MUSTER_E_FORBIDDEN;
    explicit_bzero(want, sizeof(want));
    free(m);
    return rc;
  }
  explicit_bzero(want, sizeof(want));
  for (int i = 0; i < n && !rc; i++)
    if (cl[i].live && job_claimed_token(g.api_token, secret, claim_key, cl[i].id, cl[i].attempt,
                                        cl[i].fresh) != 0)
      rc = MUSTER_E_INTERNAL;
  if (!rc && (rc = db_begin(g.db)) == 0) {
    for (int i = 0; i < n && !rc; i++)
      if (cl[i].live)
        rc = db_worker_set_token(g.db, cl[i].id, cl[i].fresh);
    if (!rc)
      rc = db_commit(g.db);
    if (rc) /* (a failed commit too: the transaction must not stay open) */
      db_rollback(g.db);
  }
  for (int i = 0; i < n && !rc; i++)
    if (cl[i].live)
      snprintf(cl[i].live->token, sizeof(cl[i].live->token), "%s", cl[i].fresh);
  free(m);
  return rc;
}

static enum MHD_Result api_claim(struct MHD_Connection *c, struct req *rq, const char *id) {
  const char *secret = api_bearer(c), *why = NULL, *field = "workers";
  struct claimed *cl = NULL;
  enum MHD_Result ret = MHD_NO;
  json_t *body, *answer, *list;
  char claim_key[129];
  int n = 0, rc, again = 0;

  if (!secret)
    return api_respond_error(c, MUSTER_E_UNAUTHORIZED, NULL, "a claim needs its job's secret");
  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = claim_parse(body, id, &cl, &n, &why);
  if (!rc && claim_key_parse(body, claim_key, sizeof(claim_key)) != 0) {
    why = "claim_key must be 32 to 128 lowercase hex digits";
    field = "claim_key";
    rc = MUSTER_E_INVALID;
    free(cl);
    cl = NULL;
  }
  json_decref(body);
  if (rc)
    return api_respond_error(c, rc, rc == MUSTER_E_INVALID ? field : NULL, "%s",
                             why ? why : "out of memory");
  state_lock();
  rc = claim_locked(secret, claim_key, cl, n, &again);
  if (rc) {
    /* (at most one warning in CLAIM_WARN_MS, under the state lock: a
     * flood of refusals is unauthenticated and must not flood the log) */
    static int64_t warned_ms;
    static long quiet;
    int64_t now = util_mono_ms();

    if (!warned_ms || now - warned_ms >= CLAIM_WARN_MS) {
      char more[64] = "";

      if (quiet)
        snprintf(more, sizeof(more), "; %ld more refused, unlogged", quiet);
      LOG(LOG_WARN, "%s: refused a claim of its job's tokens (%s)%s", id, muster_error_name(rc),
          more);
      warned_ms = now;
      quiet = 0;
    } else {
      quiet++;
    }
  }
  state_unlock();
  explicit_bzero(claim_key, sizeof(claim_key));
  if (rc) {
    free(cl);
    return api_respond_error(c, rc, NULL,
                             rc == MUSTER_E_FORBIDDEN
                                 ? "this is not the job's secret, or its job claimed its "
                                   "workers already, with another key or none, or one of "
                                   "them has registered since"
                                 : "could not claim the job's workers");
  }
  /* (tests: a controller that dies after the claim, before its answer) */
  FAULT_POINT("claim_committed");
  answer = json_object();
  list = json_array();
  json_object_set_new(answer, "workers", list);
  for (int i = 0; i < n; i++)
    if (cl[i].live)
      json_array_append_new(list, json_pack("{s:s, s:s}", "id", cl[i].id, "token", cl[i].fresh));
  LOG(LOG_INFO, "%s: its job claimed the tokens of %zu workers%s", id, json_array_size(list),
      again ? " again (the first claim's answer was lost)" : "");
  explicit_bzero(cl, (size_t)n * sizeof(*cl));
  free(cl);
  return api_respond_json(c, MHD_HTTP_OK, answer);
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_claim_routes[] = {
    /* Carries the job's secret, not a worker's token. */
    {"POST", "/api/v1/workers/{id}/claim", AUTH_SECRET, api_claim, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
