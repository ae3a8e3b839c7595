/*
 * fork_ref.c: bench/controller (d)'s floor, the fastest this host makes
 * processes at all.
 *
 *   muster-fork-ref N
 *       three rounds, each forking N children that _exit(0) at once, then
 *       N that exec /bin/true, one after another from this one process,
 *       the ended ones reaped as it goes; prints one JSON line with the
 *       best round of each: {"fork_exit_per_s": ..., "fork_exec_per_s":
 *       ...}. Exits 1, saying why, if a fork fails or a child does not
 *       exit 0.
 *
 * A launch whose one starter (a fork server) makes a process for each
 * worker cannot go faster than the first figure: it is what the kernel
 * and the hypervisor charge for a process, before any program runs in it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 3

static double now_s(void) {
  struct timespec t;

  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Reaps children, waiting for them if block, else only those that ended.
 * Returns how many were reaped; *bad counts those that did not exit 0. */
static long reap(int block, long *bad) {
  long n = 0;
  int st;
  pid_t pid;

  while ((pid = waitpid(-1, &st, block ? 0 : WNOHANG)) > 0) {
    n++;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      (*bad)++;
  }
  return n;
}

/* Starts n children (exec'ing /bin/true if exec, else ending at once) and
 * reaps them all; returns the children made a second, or -1 (said on
 * stderr). */
static double batch(long n, int exec) {
  double t0 = now_s();
  long bad = 0;

  for (long i = 0; i < n; i++) {
    pid_t pid = fork();

    if (pid == 0) {
      if (exec)
        execl("/bin/true", "true", (char *)NULL);
      _exit(exec ? 127 : 0);
    }
    if (pid < 0) {
      int err = errno;

      reap(1, &bad);
      fprintf(stderr, "muster-fork-ref: fork: %s\n", strerror(err));
      return -1;
    }
    reap(0, &bad);
  }
  reap(1, &bad);
  if (bad) {
    fprintf(stderr, "muster-fork-ref: %ld of %ld children did not exit 0%s\n", bad, n,
            exec ? " (is /bin/true there?)" : "");
    return -1;
  }
  return (double)n / (now_s() - t0);
}

int main(int argc, char **argv) {
  char *end = NULL;
  long n = argc == 2 ? strtol(argv[1], &end, 10) : 0;
  double best[2] = {0, 0};

  if (argc != 2 || *end || n < 1 || n > 100000) {
    fprintf(stderr, "usage: muster-fork-ref N (1 to 100000 children a round)\n");
    return 2;
  }
  for (int r = 0; r < ROUNDS; r++)
    for (int exec = 0; exec < 2; exec++) {
      double rate = batch(n, exec);

      if (rate < 0)
        return 1;
      if (rate > best[exec])
        best[exec] = rate;
    }
  printf("{\"fork_exit_per_s\": %.1f, \"fork_exec_per_s\": %.1f}\n", best[0], best[1]);
  return 0;
}
