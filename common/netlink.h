/*
 * netlink.h: the few rtnetlink requests (AF_NETLINK, NETLINK_ROUTE) that a
 * worker's own network namespace needs: a bridge, a veth pair with one end
 * moved into another namespace, addresses, links up, a default route. The
 * `ip` binary would cost milliseconds a worker; these are one datagram
 * each, answered by the kernel's ACK.
 *
 * Every request goes to the network namespace the socket was opened in (a
 * socket opened before unshare(CLONE_NEWNET) keeps talking to the host's).
 * Functions return 0 or -errno, as the kernel's ACK says.
 */
#ifndef MUSTER_NETLINK_H
#define MUSTER_NETLINK_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/types.h>

#define NL_MUST __attribute__((warn_unused_result))

/* The host's end of a bridged worker's veth pair: "mv" and its address in
 * hex (ip in network order), unique while the address is that worker's. */
#define NL_VETH_NAME_MAX 16
static inline void nl_worker_veth_name(struct in_addr ip, char buf[NL_VETH_NAME_MAX]) {
  static const char hex[] = "0123456789abcdef";
  uint32_t v = ntohl(ip.s_addr);

  buf[0] = 'm';
  buf[1] = 'v';
  for (int i = 0; i < 8; i++)
    buf[2 + i] = hex[(v >> (28 - 4 * i)) & 0xf];
  buf[10] = '\0';
}

/* Opens an rtnetlink socket in the calling thread's network namespace.
 * Returns its descriptor (close() it), or -errno. */
NL_MUST int nl_open(void);

/* The index of link name in fd's namespace, or -ENODEV. */
NL_MUST int nl_link_index(int fd, const char *name);

/* Creates bridge name with mac (6 bytes; fixed, so that it does not
 * change as ports come and go), down. -EEXIST if a link has that name. */
NL_MUST int nl_bridge_add(int fd, const char *name, const unsigned char mac[6]);

/* Creates a veth pair: name here, up, a port of the bridge of index
 * master (0: none); peer_name in the network namespace of process
 * peer_pid (0: here), down. */
NL_MUST int nl_veth_add(int fd, const char *name, int master, const char *peer_name,
                        pid_t peer_pid);

/* Sets link index up. */
NL_MUST int nl_link_up(int fd, int index);

/* Deletes link index (a veth takes its peer along). */
NL_MUST int nl_link_del(int fd, int index);

/* Adds addr/prefix to link index. -EEXIST if it has it. */
NL_MUST int nl_addr_add(int fd, int index, struct in_addr addr, int prefix);

/* Adds the default route through gateway gw. */
NL_MUST int nl_route_default(int fd, struct in_addr gw);

#endif
