/*
 * api.h: the REST API of docs/design.md on libmicrohttpd (epoll, thread pool).
 */
#ifndef MUSTER_API_H
#define MUSTER_API_H

#include <stddef.h>

struct ctl_config;

/* Binds cfg's address, before anything else starts, so that the
 * controller's URL is known once and for all: a port of 0 picks a free one,
 * and cfg->port holds the real one after. It listens only in api_start():
 * until then, connections are refused.
 * Returns 0 or an error with a sentence in err. */
int api_bind(struct ctl_config *cfg, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Listens on the socket api_bind() made and serves the API (after
 * state_init()).
 * Returns 0 or an error with a sentence in err. */
int api_start(char *err, size_t errlen) __attribute__((warn_unused_result));

/* Stops the daemon; every suspended connection must have been woken
 * (state_begin_shutdown()) first. */
void api_stop(void);

#endif
