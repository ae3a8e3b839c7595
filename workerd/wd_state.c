/*
 * wd_state.c: the daemon's one state, wd (struct wd_state, workerd.h), in
 * the manner of Redis's `server`. Every module reads and writes it; this
 * file only defines it and calls nothing.
 */
#include "workerd.h"

/* The daemon's one state (workerd.h). */
struct wd_state wd;
