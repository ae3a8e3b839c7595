/*
 * harness_cleanup.h: how the harness ends what a test started through it
 * (harness.c's part; tests call h_finish()): its controllers, their
 * workers, cgroups, bridges and overlays, by pid and by the controllers'
 * own lists. At h_finish(), at the test process's exit, and, when the test
 * process ends without running its exit handlers (a failed Check assertion
 * ends it with _exit(), a Check timeout kills it), from a guardian process
 * that hc_init() leaves beside it.
 */
#ifndef MUSTER_HARNESS_CLEANUP_H
#define MUSTER_HARNESS_CLEANUP_H

#include "harness.h"

/* Once per test process, before its first controller: makes it the
 * subreaper of the workers its controllers leave, sets the exit handler
 * and starts the guardian. */
void hc_init(void);

/* c was started or restarted, or its controller ended (c->pid 0): from now
 * on, what c leaves is ended at the test process's end, however it ends. */
void hc_started(struct ctl_proc *c);

/* Stops c's controller (SIGTERM, then SIGKILL after 5 s), kills the worker
 * processes it started, removes their cgroups, its bridge and its
 * sessions' overlays. c is then forgotten (its files stay). */
void hc_end(struct ctl_proc *c);

#endif
