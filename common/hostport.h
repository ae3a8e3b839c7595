/*
 * hostport.h: the one parser of "host:port" that every part uses: the
 * controller's --listen, the trainer's TF_CONFIG cluster spec, and the
 * exec-address lists muster run hands its mpirun (MUSTER_EXEC_HOSTS,
 * MUSTER_EXEC_RANKS: "ip:port,ip:port,...").
 *
 * A host may be an IPv6 address, bare ("::1:8470": the port follows the
 * last colon) or in brackets ("[::1]:8470"); the brackets are not part of
 * the host that comes out.
 */
#ifndef MUSTER_HOSTPORT_H
#define MUSTER_HOSTPORT_H

#include <stddef.h>

/* libmuster compiles this file in as well; it is not part of its API. */
#define HOSTPORT_API __attribute__((visibility("hidden")))

/* Splits the len bytes at s ("host:port") into host (NUL-terminated, at
 * most hostcap - 1 bytes, never empty) and *port (from port_min to 65535,
 * decimal digits only, running to the end of the len bytes). Returns 0, or
 * -1 when s is not of that form or the host does not fit. */
HOSTPORT_API __attribute__((warn_unused_result)) int
hostport_split(const char *s, size_t len, char *host, size_t hostcap, int port_min, int *port);

/* In a comma-separated list of "host:port" entries, finds the entry whose
 * host is host, or if host is NULL the index-th entry (from 0). Fills hostout
 * and *port as hostport_split does. Returns 0, or -1 if there is no such
 * entry (a malformed entry never matches). */
HOSTPORT_API __attribute__((warn_unused_result)) int hostport_list_find(const char *list,
                                                                        const char *host,
                                                                        long index, char *hostout,
                                                                        size_t hostcap, int *port);

#endif
