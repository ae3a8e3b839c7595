/*
 * fork_ref.c: bench/controller (d)'s floor, the fastest this host makes
 * processes at all.
 *
 *   muster-fork-ref N
 *       three rounds, each forking N children that _exit(0) at once, then
 *       N that exec /bin/true, then N /bin/true started by posix_spawn()
 *       (which glibc makes with clone(CLONE_VM | CLONE_VFORK): no copy of
 *       this process's page tables), one after another from this one
 *       process, the ended ones reaped as it goes; prints one JSON line
 *       with the best round of each: {"fork_exit_per_s": ...,
 *       "fork_exec_per_s": ..., "spawn_per_s": ...}. Exits 1, saying why,
 *       if a start fails or a child does not exit 0.
 *
 * A launch whose one starter makes a process for each worker cannot go
 * faster than the first figure if it forks one (a fork server's copy of
 * itself, as muster's), nor than the third if it spawns a program: what
 * the kernel and the hypervisor charge for a process, before any of the
 * worker's own code runs in it.
 */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 3

enum how { FORK_EXIT, FORK_EXEC, SPAWN, HOW_N };

extern char **environ;

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

/* Starts n children as how says and reaps them all; returns the children
 * made a second, or -1 (said on stderr). */
static double batch(long n, enum how how) {
  static char *const argv[] = {"true", NULL};
  double t0 = now_s();
  long bad = 0;

  for (long i = 0; i < n; i++) {
    pid_t pid;
    int err = 0;

    if (how == SPAWN) {
      err = posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ);
    } else if ((pid = fork()) == 0) {
      if (how == FORK_EXEC)
        execv("/bin/true", argv);
      _exit(how == FORK_EXEC ? 127 : 0);
    } else if (pid < 0) {
      err = errno;
    }
    if (err) {
      reap(1, &bad);
      fprintf(stderr, "muster-fork-ref: %s: %s\n", how == SPAWN ? "posix_spawn" : "fork",
              strerror(err));
      return -1;
    }
    reap(0, &bad);
  }
  reap(1, &bad);
  if (bad) {
    fprintf(stderr, "muster-fork-ref: %ld of %ld children did not exit 0%s\n", bad, n,
            how != FORK_EXIT ? " (is /bin/true there?)" : "");
    return -1;
  }
  return (double)n / (now_s() - t0);
}

int main(int argc, char **argv) {
  char *end = NULL;
  long n = argc == 2 ? strtol(argv[1], &end, 10) : 0;
  double best[HOW_N] = {0};

  if (argc != 2 || *end || n < 1 || n > 100000) {
    fprintf(stderr, "usage: muster-fork-ref N (1 to 100000 children a round)\n");
    return 2;
  }
  for (int r = 0; r < ROUNDS; r++)
    for (int how = 0; how < HOW_N; how++) {
      double rate = batch(n, (enum how)how);

      if (rate < 0)
        return 1;
      if (rate > best[how])
        best[how] = rate;
    }
  printf("{\"fork_exit_per_s\": %.1f, \"fork_exec_per_s\": %.1f, \"spawn_per_s\": %.1f}\n",
         best[FORK_EXIT], best[FORK_EXEC], best[SPAWN]);
  return 0;
}
