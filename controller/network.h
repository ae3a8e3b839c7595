/*
 * network.h: the local workers' network (`--network bridge|host`,
 * `--subnet CIDR`). In bridge mode each local worker is a network
 * namespace of its own on a bridge the controller owns (workerd/netns.c
 * plugs it in): its own address, the controller at the bridge's address,
 * the gateway. In host mode workers share the host's network, each with a
 * loopback address of its own (127.0.X.Y).
 *
 * net_setup() decides once, at start, before the API's socket is bound;
 * everything after reads what it decided.
 */
#ifndef MUSTER_NETWORK_H
#define MUSTER_NETWORK_H

#include "subnet.h"

#include <stddef.h>

/* --network: bridge where allowed (the default), or one of them. */
enum net_choice { NET_AUTO, NET_BRIDGE, NET_HOST };

/* Decides the workers' network for a controller of backend (choice and
 * cidr from its options; cidr NULL or "" for the default subnet). In
 * bridge mode, takes the bridge's lock (/run/muster/BRIDGE.lock, held
 * until exit), makes the bridge if it is not there, gives it the gateway
 * address and sets it up. Returns 0, or an error with a sentence in err:
 * an invalid subnet, another controller on the bridge, a subnet that
 * overlaps one of the host's, or (NET_BRIDGE only) a host that does not
 * allow a bridge. */
int net_setup(enum net_choice choice, const char *cidr, const char *backend, char *err,
              size_t errlen) __attribute__((warn_unused_result));

/* 1 in bridge mode. */
int net_bridge(void);

/* "bridge" or "host". */
const char *net_mode(void);

/* Why the workers are on the host's network (a sentence), or NULL in
 * bridge mode. Borrowed. */
const char *net_reason(void);

/* The gateway's address, dotted ("" in host mode). Borrowed. */
const char *net_gateway(void);

/* The bridge's name ("" in host mode). Borrowed. */
const char *net_bridge_name(void);

/* The subnet, "A.B.C.D/N" ("" in host mode). Borrowed. */
const char *net_subnet_text(void);

/* workerd's MUSTER_NETNS: "BRIDGE GATEWAY/PREFIX" ("" in host mode).
 * Borrowed. */
const char *net_workerd_setting(void);

/* How many workers' addresses there are, at most cap. */
int net_slots(int cap);

/* A worker's address of slot into buf. */
void net_slot_ip(int slot, char *buf, size_t size);

/* The slot of a worker's address, or -1. */
int net_ip_slot(const char *ip);

#endif
