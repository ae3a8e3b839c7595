/* launch_lease.c: muster launch --lease: launches workers holding their
 * session's lease and stays until they end, stopping them at once on
 * SIGINT, SIGTERM or SIGHUP. */
#include "launch_lease.h"
#include "cli.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* muster launch --lease: a thread that waits for SIGINT, SIGTERM or
 * SIGHUP (blocked in every thread) and cancels the main thread's await. */
struct sigwatch {
  sigset_t set;
  muster_client *c;
  volatile int got;
};

static void *sigwatch_main(void *arg) {
  struct sigwatch *s = arg;
  int sig = 0;

  if (sigwait(&s->set, &sig) == 0 && sig != SIGUSR1) {
    s->got = sig;
    muster_client_cancel(s->c);
  }
  return NULL;
}

/* Launches o holding its session's lease, prints the workers, and stays
 * until they have all ended (exit 0 if all succeeded) or a signal comes
 * (they are stopped at once). If this process dies, the lease runs out
 * and the controller stops them. */
int launch_leased(muster_client *c, const muster_launch_opts *o, double ttl, int as_json) {
  struct sigwatch sw = {.c = NULL, .got = 0};
  muster_lease *lease = NULL;
  muster_worker_list ws = {0};
  muster_await_result ar;
  const char **ids = NULL;
  pthread_t t;
  int rc, code = EXIT_OK, watching = 0;

  memset(&ar, 0, sizeof(ar));
  sigemptyset(&sw.set);
  sigaddset(&sw.set, SIGINT);
  sigaddset(&sw.set, SIGTERM);
  sigaddset(&sw.set, SIGHUP);
  sigaddset(&sw.set, SIGUSR1);
  /* Before any thread starts, so that all of them inherit the mask. */
  pthread_sigmask(SIG_BLOCK, &sw.set, NULL);
  rc = muster_lease_start(c, o->session, ttl, &lease);
  if (rc)
    return call_failed(c, rc);
  rc = muster_launch(c, o, &ws);
  if (rc) {
    code = call_failed(c, rc);
    goto out;
  }
  print_launched(&ws, as_json);
  fflush(stdout);
  ids = calloc(ws.count + 1, sizeof(*ids));
  sw.c = c; /* a signal cancels the await */
  watching = pthread_create(&t, NULL, sigwatch_main, &sw) == 0;
  if (!ids) {
    code = out_of_memory();
    goto out;
  }
  for (size_t i = 0; i < ws.count; i++)
    ids[i] = ws.items[i].id;
  fprintf(stderr,
          "muster launch: holding session %s's lease (ttl %g s) until the workers end; "
          "Ctrl-C stops them\n",
          o->session, ttl);
  /* Until they end: across a restart of the controller, too (the lease
   * thread keeps renewing; the controller gives the lease a ttl of grace). */
  for (;;) {
    rc = muster_await(sw.c, ids, ws.count, 1, 60, &ar);
    if (sw.got || (rc == 0 && !ar.timed_out))
      break;
    if (rc == 0) { /* a minute passed: wait on (each wait is bounded) */
      muster_await_result_free(&ar);
      memset(&ar, 0, sizeof(ar));
      continue;
    }
    if (rc != MUSTER_E_UNREACHABLE && rc != MUSTER_E_PROTOCOL && rc != MUSTER_E_TIMEOUT &&
        rc != MUSTER_E_SHUTTING_DOWN && rc != MUSTER_E_BACKEND_DOWN)
      break;
    sleep(1);
  }
  if (sw.got) {
    fprintf(stderr, "muster launch: %s: stopping the workers\n", strsignal(sw.got));
    code = EXIT_WORKERS;
  } else if (rc) {
    code = call_failed(sw.c, rc);
  } else if (ar.failures.count) {
    code = EXIT_WORKERS;
  }
out:
  /* A clean end (all ended, or a signal): its workers go now (only its
   * own: an explicit --session may hold others'), then the lease. */
  rc = 0;
  if (ws.count && ids) {
    muster_client *s = NULL;
    muster_worker_list stopped;
    /* c may be cancelled (a signal): a client of its own. */
    rc = connect_client(&s) ? MUSTER_E_UNREACHABLE : muster_stop(s, ids, ws.count, NULL, &stopped);
    if (rc == 0)
      muster_worker_list_free(&stopped);
    muster_client_free(s);
  }
  {
    char why[512];
    if (muster_lease_error(lease, why, sizeof(why))[0])
      fprintf(stderr, "muster launch: %s\n", why);
  }
  /* Workers that could not be stopped keep the lease, left to run out: the
   * controller then stops them. */
  if (rc) {
    (void)muster_lease_end(lease, MUSTER_LEASE_ABANDON);
  } else if (muster_lease_end(lease, MUSTER_LEASE_RELEASE) != 0) {
    rc = MUSTER_E_UNREACHABLE;
  }
  if (rc) {
    fprintf(stderr,
            "muster launch: could not stop the workers and give the lease back (%s); "
            "they stop when the lease runs out\n",
            muster_strerror(rc));
    if (code == EXIT_OK)
      code = exit_code_for(rc);
  }
  if (watching) {
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
  }
  muster_await_result_free(&ar);
  muster_worker_list_free(&ws);
  free(ids);
  return code;
}
