/*
 * fault.h: named fault-injection points, compiled into test builds only.
 *
 * FAULT_POINT("name") does nothing in a build without MUSTER_FAULT_INJECTION.
 * In a test build it reads MUSTER_FAULT once, a comma-separated list of
 * "name:action" where action is
 *   abort      the process dies at once with SIGKILL, as if by kill -9
 *   delay=MS   the calling thread sleeps MS milliseconds
 * so that a test can make the race it is about happen every time instead of
 * hoping for it. Unknown names are ignored: a point only exists where the
 * code names it.
 */
#ifndef MUSTER_FAULT_H
#define MUSTER_FAULT_H

#ifdef MUSTER_FAULT_INJECTION
/* Acts on the point name if MUSTER_FAULT names it. */
void fault_point(const char *name);
#define FAULT_POINT(name) fault_point(name)
#else
#define FAULT_POINT(name) ((void)0)
#endif

#endif
