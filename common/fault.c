/* fault.c: see fault.h. */
#include "fault.h"

#ifdef MUSTER_FAULT_INJECTION
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAULT_MAX_FAILS 16 /* fail=N and delay=MS*N entries counted */

static const char *spec;
static pthread_once_t spec_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t fails_mu = PTHREAD_MUTEX_INITIALIZER;
/* How many times each fail=N or delay=MS*N entry (by its offset in spec)
 * was reached, and how many of those it failed or slept. */
static struct {
  const char *entry;
  long seen, used;
} fails[FAULT_MAX_FAILS];

static void spec_load(void) {
  spec = getenv("MUSTER_FAULT");
}

/* Whether the fail=n@skip entry at p fails this time: once it has been
 * reached skip times, n times. */
static int fail_once_more(const char *p, long n, long skip) {
  int i, yes = 0;

  pthread_mutex_lock(&fails_mu);
  for (i = 0; i < FAULT_MAX_FAILS && fails[i].entry && fails[i].entry != p; i++)
    ;
  if (i < FAULT_MAX_FAILS) {
    fails[i].entry = p;
    if (fails[i].seen++ >= skip && fails[i].used < n) {
      fails[i].used++;
      yes = 1;
    }
  }
  pthread_mutex_unlock(&fails_mu);
  return yes;
}

/* The N of "fail=N" or "fail=N@SKIP" at action + 5, and SKIP (0 if not
 * given); 0 if it is neither. */
static long fail_count(const char *action, long *skip) {
  char *end;
  long n = strtol(action + 5, &end, 10);

  *skip = 0;
  if (*end == '@') {
    const char *at = end + 1;

    *skip = strtol(at, &end, 10);
    if (end == at || *skip < 0)
      return 0;
  }
  return n > 0 && (*end == '\0' || *end == ',') ? n : 0;
}

int fault_point(const char *name) {
  size_t nlen = strlen(name);
  const char *p;
  int fail = 0;

  pthread_once(&spec_once, spec_load);
  for (p = spec; p && *p; p += strcspn(p, ","), p += *p == ',') {
    const char *action;
    char *end;
    long ms, n, skip;

    if (strncmp(p, name, nlen) != 0 || p[nlen] != ':')
      continue;
    action = p + nlen + 1;
    if (strncmp(action, "abort", 5) == 0) {
      fprintf(stderr, "fault injection: %s: killed\n", name);
      kill(getpid(), SIGKILL);
    } else if (strncmp(action, "delay=", 6) == 0 && (ms = strtol(action + 6, &end, 10)) > 0 &&
               (*end == '\0' || *end == ',' || *end == '*')) {
      struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

      /* (delay=MS*N: the first N times only) */
      if (*end == '*' && ((n = strtol(end + 1, &end, 10)) <= 0 || (*end != '\0' && *end != ',') ||
                          !fail_once_more(p, n, 0)))
        continue;
      while (nanosleep(&ts, &ts) != 0)
        ;
    } else if (strncmp(action, "fail=", 5) == 0 && (n = fail_count(action, &skip)) > 0 &&
               fail_once_more(p, n, skip)) {
      fprintf(stderr, "fault injection: %s: fails\n", name);
      fail = 1;
    }
  }
  return fail;
}
#endif
