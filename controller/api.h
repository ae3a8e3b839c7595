/*
 * api.h: the REST API of docs/design.md on libmicrohttpd (epoll, thread pool).
 */
#ifndef MUSTER_API_H
#define MUSTER_API_H

#include <stddef.h>

/* Starts the HTTP daemon on g.cfg's address. A port of 0 picks a free one;
 * either way g.cfg.port and g.controller_url hold the real ones after.
 * Returns 0 or an error with a sentence in err. */
int api_start(char *err, size_t errlen) __attribute__((warn_unused_result));

/* Stops the daemon; every suspended connection must have been woken
 * (state_begin_shutdown()) first. */
void api_stop(void);

#endif
