/*
 * scratch.h: the private /tmp each session's workers share on a host
 * (STATE/scratch/SESSION/tmp), made and held by workerd, removed by the last
 * workerd of the session to leave, or swept by the controller at its start.
 */
#ifndef MUSTER_SCRATCH_H
#define MUSTER_SCRATCH_H

#include "session_name.h"
#include <stddef.h>

struct scratch {
  char tmp[4200]; /* the directory bound over the workers' /tmp */
  int lock_fd;    /* held shared while this workerd lives; -1: none */
  int overlay;    /* tmp is the overlay: the host's /tmp below, the session's above */
  char name[SESSION_STORED_MAX]; /* the session's directory under STATE/scratch */
};

/* 1 if session may name a directory (letters, digits, '-', '_', '.'; not
 * starting with '.' or '-'; 64 at most). */
int scratch_session_ok(const char *session);
/* Makes (or joins) session's tree under state and holds it. Returns 0, or
 * -1 with a sentence in err. */
int scratch_enter(const char *state, const char *session, struct scratch *s, char *err,
                  size_t errlen);
/* Lets go of it; the last one out removes the tree. */
void scratch_leave(const char *state, struct scratch *s);
/* Removes every tree no workerd holds (at the controller's start). */
void scratch_sweep(const char *state);
/* Removes name under dirfd and all it holds, following no link and
 * crossing no mount. Returns 0 or -1 (errno set). */
int scratch_rmtree_at(int dirfd, const char *name);

#endif
