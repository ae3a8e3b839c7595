/*
 * fault.h: named fault-injection points, compiled into test builds only.
 *
 * FAULT_POINT("name") and FAULT_FAILS("name") do nothing (the latter is 0)
 * in a build without MUSTER_FAULT_INJECTION. In a test build they read
 * MUSTER_FAULT once, a comma-separated list of "name:action" where action is
 *   abort      the process dies at once with SIGKILL, as if by kill -9
 *   delay=MS   the calling thread sleeps MS milliseconds
 *   delay=MS*N ... the first N times it is reached only
 *   fail=N     FAULT_FAILS("name") is true the first N times it is reached
 *              (the code then acts as if what it guards had failed)
 *   fail=N@K   ... the N times after the first K
 * so that a test can make the race it is about happen every time instead of
 * hoping for it. Unknown names are ignored: a point only exists where the
 * code names it.
 */
#ifndef MUSTER_FAULT_H
#define MUSTER_FAULT_H

#ifdef MUSTER_FAULT_INJECTION
/* Acts on the point name if MUSTER_FAULT names it; returns 1 when its
 * action is a fail=N not yet used up. */
int fault_point(const char *name);
#define FAULT_POINT(name) ((void)fault_point(name))
#define FAULT_FAILS(name) fault_point(name)
#else
#define FAULT_POINT(name) ((void)0)
#define FAULT_FAILS(name) 0
#endif

#endif
