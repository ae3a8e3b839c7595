/* sched.c: admission: the workers that wait for a start are placed by the
 * backend, their new attempts committed, and only then submitted. See
 * docs/internals/controller.md, "Exactly once". */
#include "state_internal.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "users.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether schedule_locked() has something to do for w. */
static int wants_start(const struct lw *w) {
  if (w->status == WS_STARTING)
    return w->restart;
  if (w->status != WS_SCHEDULING)
    return 0;
  return !lw_submitted(w) || w->restart;
}

/* sm_commit(), or in a test build a commit that fails (fault point
 * schedule_commit: the batch rolled back). */
static int commit_pass(void) {
  if (FAULT_FAILS("schedule_commit")) {
    sm_rollback();
    return MUSTER_E_DB;
  }
  return sm_commit();
}

/* A pass that failed: the next one in 100 ms, not at once (monitor.c).
 * The reasons it wrote for workers that wait may have been rolled back with
 * it: forgotten here, the next pass writes them again. */
static void retry_later(void) {
  g.schedule_needed = 1;
  g.schedule_retry_ms = util_mono_ms() + 100;
  for (struct lw *w = g.queue.head; w; w = w->queue_link.next)
    w->waiting_for[0] = '\0';
}

/* Fails w, whose backend could not act on it (what: "could not be
 * placed", "could not be started"; why: the backend's words). Returns 0, or
 * an error (logged; the next pass tries again). */
static int fail_one(struct lw *w, const char *what, const char *why) {
  char failure[600];
  char id[16];
  int rc;

  snprintf(id, sizeof(id), "%s", w->id);
  snprintf(failure, sizeof(failure), "%s by the %s backend: %s", what, g.backend->name, why);
  rc = sm_fail_locked(w, failure);
  if (rc) {
    LOG(LOG_ERROR, "could not fail %s (%s): %s", id, failure, db_errmsg(g.db));
    retry_later();
  }
  return rc;
}

/* Fails the n workers of batch, whose attempts are committed but which the
 * backend could not take (why). */
static void fail_batch(struct lw **batch, int n, const char *why) {
  for (int i = 0; i < n; i++)
    (void)fail_one(batch[i], "could not be started", why);
}

/* The account w's commands run as (struct backend_start): its user's
 * unix account, read once per user and pass (user and account hold the
 * last one read), else "" for the backend's own. NULL when the user's row
 * cannot be read: never the backend's own account instead. */
static const char *worker_account(const struct lw *w, char *user, char *account) {
  const char *slash = strchr(w->session, '/');
  size_t n = slash ? (size_t)(slash - w->session) : 0;
  struct db_user u;

  if (!n || n > USER_NAME_MAX)
    return "";
  if (strlen(user) == n && strncmp(user, w->session, n) == 0)
    return account;
  memcpy(user, w->session, n);
  user[n] = '\0';
  account[0] = '\0';
  switch (db_user_get(g.db, user, &u)) {
  case 0:
    snprintf(account, sizeof(u.unix_user), "%s", u.unix_user);
    return account;
  case MUSTER_E_NOT_FOUND:
    return account;
  default:
    user[0] = '\0';
    return NULL;
  }
}

/* Sends a batch back to the next pass: w (placed, not in batch) and the n
 * workers of batch give their room back, and their transaction is rolled
 * back. */
static void batch_back(struct lw *w, struct lw **batch, int n) {
  g.backend->release(w->id);
  sm_rollback();
  for (int i = 0; i < n; i++)
    g.backend->release(batch[i]->id);
  retry_later();
}

/* Hands the backend every worker that waits for a start, oldest first,
 * while it has room: the backend reserves room (place), the new attempts
 * are committed with the `starting` state, and only then is the backend
 * asked to act (submit). A worker that does not fit now does not hold back
 * smaller ones behind it; why it waits is recorded.
 *
 * A queueing backend (Slurm) gets whole launches, however large, and its
 * workers stay `scheduling` with their new attempt committed: they leave
 * the queue when the backend reports them started. */
void schedule_locked(void) {
  const int queues = g.backend->queues;
  /* Batches of 64 on the stack; a queueing backend's whole launches may be
   * larger: room for every live worker then. */
  struct backend_placement where_s[64];
  struct backend_start starts_s[64];
  struct lw *batch_s[64];
  struct backend_placement *where = where_s;
  struct backend_start *starts = starts_s;
  struct lw **batch = batch_s;
  struct lw *w = g.queue.head, *next;
  char user[USER_NAME_MAX + 1] = "", account[sizeof(((struct db_user *)0)->unix_user)] = "";
  char(*accounts)[sizeof(account)] = NULL;
  int cap = 64;

  g.schedule_needed = 0;
  if (queues) {
    cap = g.live_count + 1;
    where = calloc((size_t)cap, sizeof(*where));
    starts = calloc((size_t)cap, sizeof(*starts));
    batch = calloc((size_t)cap, sizeof(*batch));
  }
  accounts = calloc((size_t)cap, sizeof(*accounts));
  if (!where || !starts || !batch || !accounts) {
    LOG(LOG_ERROR, "out of memory scheduling workers");
    retry_later();
    goto out;
  }
  while (w) {
    const char *launch = NULL;
    char refused[300] = "";
    struct lw *broken = NULL; /* the backend could not place it, ever: it fails */
    char broken_why[160] = "";
    int n = 0, rc;

    rc = sm_begin();
    if (rc) {
      LOG(LOG_ERROR, "could not begin a transaction: %s", db_errmsg(g.db));
      retry_later();
      goto out;
    }
    for (; w && n < cap; w = next) {
      struct db_fields f = DB_FIELDS_INIT;
      char why[160], detail[256];
      int next_attempt = w->attempt + 1;
      enum wstatus to = WS_STARTING;
      const char *acct;

      next = w->queue_link.next;
      if (!wants_start(w)) {
        /* (given a new attempt, or started: it leaves the queue until
         * another attempt is wanted) */
        lw_unqueue_locked(w);
        continue;
      }
      /* One launch per submit for a queueing backend: the next launch
       * starts the next batch. */
      if (queues && launch && strcmp(launch, w->launch) != 0)
        break;
      memset(&where[n], 0, sizeof(where[n]));
      rc = g.backend->place(w->id, &w->req, &where[n], why, sizeof(why));
      if (rc < 0) {
        /* Failed after its launch was answered: it fails, saying why, once
         * this batch is committed (nothing would ever place it again). */
        broken = w;
        snprintf(broken_why, sizeof(broken_why), "%s", why);
        w = w->queue_link.next;
        break;
      }
      if (rc == 0) {
        if (w->status == WS_SCHEDULING && strcmp(why, w->waiting_for) != 0) {
          snprintf(w->waiting_for, sizeof(w->waiting_for), "%s", why);
          if (db_worker_set_waiting(g.db, w->id, why) != 0)
            LOG(LOG_WARN, "could not record why %s waits: %s", w->id, db_errmsg(g.db));
        }
        continue;
      }
      /* (placed: its account, looked up once per user and pass; a user
       * that cannot be read sends the whole batch back to the next pass,
       * never runs it as another account, nor splits a launch) */
      if (!(acct = worker_account(w, user, account))) {
        LOG(LOG_ERROR, "could not read the user of %s: %s", w->id, db_errmsg(g.db));
        batch_back(w, batch, n);
        goto out;
      }
      launch = w->launch;
      if (queues && w->status == WS_SCHEDULING)
        to = WS_SCHEDULING;
      f.attempt = next_attempt;
      f.bind_ip = where[n].bind_ip[0] ? where[n].bind_ip : NULL;
      f.gpu_indices = where[n].gpu_indices[0] ? where[n].gpu_indices : NULL;
      if (w->restart)
        snprintf(detail, sizeof(detail),
                 "attempt %d on the %s backend: attempt %d was not running when the "
                 "controller restarted",
                 next_attempt, g.backend->name, w->attempt);
      else if (to == WS_SCHEDULING) {
        char shape[160] = "";
        if (g.backend->describe)
          g.backend->describe(&w->req, shape, sizeof(shape));
        snprintf(detail, sizeof(detail), "attempt %d submitted to the %s backend's queue%s%s",
                 next_attempt, g.backend->name, shape[0] ? ": " : "", shape);
      } else
        snprintf(detail, sizeof(detail), "attempt %d on the %s backend%s%s", next_attempt,
                 g.backend->name, where[n].bind_ip[0] ? ", address " : "", where[n].bind_ip);
      if (sm_transition(w, to, &f, detail) != 0) {
        /* The row may be half written: the whole batch goes back, and
         * tries again on the next pass. */
        LOG(LOG_ERROR, "could not record the start of %s: %s", w->id, db_errmsg(g.db));
        batch_back(w, batch, n);
        goto out;
      }
      if (to == WS_SCHEDULING) {
        snprintf(w->waiting_for, sizeof(w->waiting_for), "submitted to the %s backend",
                 g.backend->name);
        if (db_worker_set_waiting(g.db, w->id, w->waiting_for) != 0)
          LOG(LOG_WARN, "could not record why %s waits: %s", w->id, db_errmsg(g.db));
      } else {
        w->waiting_for[0] = '\0';
      }
      snprintf(accounts[n], sizeof(accounts[n]), "%s", acct);
      batch[n++] = w;
    }
    FAULT_POINT("schedule_before_commit");
    if (commit_pass() != 0) {
      for (int i = 0; i < n; i++)
        g.backend->release(batch[i]->id);
      retry_later(); /* the next pass tries again */
      goto out;
    }
    /* Committed: whatever crashes from here on, a workerd of another
     * attempt can never register. */
    for (int i = 0; i < n; i++) {
      starts[i].id = batch[i]->id;
      starts[i].launch = batch[i]->launch;
      starts[i].controller_url = g.worker_url;
      starts[i].token = batch[i]->token;
      starts[i].account = accounts[i];
      starts[i].attempt = batch[i]->attempt;
      starts[i].req = &batch[i]->req;
      starts[i].where = &where[i];
    }
    /* A backend that could not take the batch (out of memory) says so at
     * once: its workers fail, saying why, rather than wait for ever. */
    if (n && g.backend->submit(starts, n, refused, sizeof(refused)) != 0)
      fail_batch(batch, n, refused);
    if (broken && fail_one(broken, "could not be placed", broken_why) != 0)
      goto out;
  }
out:
  free(accounts);
  if (queues) {
    free(where);
    free(starts);
    free(batch);
  }
}
