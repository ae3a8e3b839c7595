/*
 * subnet.h: the workers' subnet in bridge mode (`--network bridge`,
 * `--subnet CIDR`): its parsing, the name of the bridge that holds it, the
 * gateway address (the bridge's, the controller's address for workers) and
 * the mapping between the local backend's address slots and the workers'
 * addresses. One place, so that the controller, workerd and the tests
 * cannot disagree.
 */
#ifndef MUSTER_SUBNET_H
#define MUSTER_SUBNET_H

#include <stddef.h>
#include <stdint.h>

#define SUBNET_DEFAULT "10.213.0.0/16"
#define SUBNET_DEFAULT_BRIDGE "muster0"

struct subnet {
  uint32_t base; /* host byte order, its host bits zero */
  int prefix;    /* 8 .. 29 */
};

/* Parses "A.B.C.D/N" (N 8 to 29, the host bits zero). Returns 0, or -1
 * with a sentence (what is wrong) in err. */
int subnet_parse(const char *cidr, struct subnet *s, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* "A.B.C.D/N" into buf. */
void subnet_format(const struct subnet *s, char *buf, size_t size);

/* The bridge's name (at most 15 bytes): "muster0" for the default subnet,
 * else "mu" and the subnet in hex, so that two different subnets never
 * share a bridge. */
void subnet_bridge_name(const struct subnet *s, char *buf, size_t size);

/* The gateway's address, the subnet's first (host byte order). */
uint32_t subnet_gateway(const struct subnet *s);

/* How many workers' addresses it has (from the second host on, the
 * broadcast address left out), at most cap. */
int subnet_slots(const struct subnet *s, int cap);

/* The address of slot (0 .. subnet_slots() - 1), dotted, into buf. */
void subnet_slot_ip(const struct subnet *s, int slot, char *buf, size_t size);

/* The slot of a dotted address, or -1 if it is none of the subnet's. */
int subnet_ip_slot(const struct subnet *s, const char *ip);

#endif
