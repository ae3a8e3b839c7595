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

static const char *spec;
static pthread_once_t spec_once = PTHREAD_ONCE_INIT;

static void spec_load(void) {
  spec = getenv("MUSTER_FAULT");
}

void fault_point(const char *name) {
  size_t nlen = strlen(name);
  const char *p;

  pthread_once(&spec_once, spec_load);
  for (p = spec; p && *p; p += strcspn(p, ","), p += *p == ',') {
    const char *action;
    char *end;
    long ms;

    if (strncmp(p, name, nlen) != 0 || p[nlen] != ':')
      continue;
    action = p + nlen + 1;
    if (strncmp(action, "abort", 5) == 0) {
      fprintf(stderr, "fault injection: %s: killed\n", name);
      kill(getpid(), SIGKILL);
    } else if (strncmp(action, "delay=", 6) == 0 && (ms = strtol(action + 6, &end, 10)) > 0 &&
               (*end == '\0' || *end == ',')) {
      struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
      while (nanosleep(&ts, &ts) != 0)
        ;
    }
  }
}
#endif
