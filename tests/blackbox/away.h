/*
 * away.h: what the tests of a worker whose controller is away share
 * (check_away.c, check_idle.c): one controller per test, paused under a
 * guardian process, and the measures they take of its workers.
 */
#ifndef MUSTER_AWAY_H
#define MUSTER_AWAY_H

#include "harness.h"

#include <stddef.h>
#include <sys/types.h>

#define PATHLEN 128
#define NOTICE "[muster-workerd: "

extern struct ctl_proc ctl; /* the test's controller */
extern char aw_tmp[112];    /* the test's own directory: the scripts' files */

/* path gets name inside aw_tmp. */
void aw_in_tmp(char *path, const char *name);
void aw_touch(const char *name);
/* A controller whose workers heartbeat every 0.3 s, so that some call of
 * theirs is certain to meet a pause, and a fresh directory for the scripts. */
void aw_up(void);
void aw_down(void);
/* Check ends a failed test with _exit(): no atexit handler runs, and the
 * SIGTERM that the controller gets when its parent dies (PR_SET_PDEATHSIG)
 * would stay pending for ever in a stopped controller. A guardian process
 * outlives the test and, unless aw_unguard() tells it that all went well,
 * continues the controller, which then takes its SIGTERM and ends. */
void aw_guard(pid_t pid);
void aw_unguard(void);
/* The state letter of pid ('T' stopped, 'Z' zombie), or 0 when it is gone. */
char aw_state_of(long pid);
/* SIGSTOP to the controller; returns 1 once it is stopped (2 s at most).
 * Asserts nothing: the exec test calls it from a thread of its own. */
int aw_ctl_stop(void);
/* How many connections to port hold bytes that the listener has not read:
 * calls made to a controller that does not answer (from /proc/net/tcp; the
 * controller's own end of each, before or after accept()). */
int aw_calls_waiting(int port);
/* Returns 1 once some call waits at the controller's port (5 s at most). */
int aw_call_waits(void);
/* Pauses the controller, under a guardian, and asserts that it stopped and
 * that a call of a workerd waits on it. */
void aw_pause_ctl(int want_call);
void aw_resume_ctl(void);
/* t seconds as a message says them: "1.23 s", or "over C s" where the wait
 * gave up (t < 0) at its ceiling C. buf: 32 bytes. */
const char *aw_secs(double t, double ceiling, char *buf);
/* Seconds from t0 until path exists, or -1 after ceiling seconds. */
double aw_file_after(const char *path, double t0, double ceiling);
/* Seconds from t0 until pid is gone (or a zombie), or -1 after ceiling. */
double aw_gone_after(long pid, double t0, double ceiling);
/* How many processes have pid as their parent. */
int aw_children_of(long pid);
/* Launches one worker (code under kernel; idle if code is NULL), waits until
 * it runs and copies its id into id. */
void aw_launch(const char *kernel, const char *code, char *id, size_t len);
/* Worker id's stdout as GET .../logs gives it (malloc'ed). */
char *aw_log_of(const char *id);
/* The notices of a log that workerd dropped bytes ("[muster-workerd: N bytes
 * of output dropped while the controller was unreachable]\n"): their N added
 * up, and in *len the bytes the notices themselves take. */
unsigned long long aw_dropped_in(const char *text, size_t *len);

#endif
