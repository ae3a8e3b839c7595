/*
 * netns.c: a local worker's own network namespace (the controller's
 * `--network bridge`). Before it does anything else but join its cgroup,
 * the workerd (root, still in the host's namespaces) makes a network
 * namespace for itself and everything it will start, and plugs it into
 * the controller's bridge as a pod is: a veth pair, the host's end a port
 * of the bridge, up, the other end this namespace's eth0, with the
 * worker's address (MUSTER_BIND_IP), and a default route through the
 * bridge's address, the gateway (where the controller also listens).
 *
 * The host's end is made from a netlink socket opened before the unshare,
 * which keeps talking to the host's namespace; the peer goes straight into
 * the new one (IFLA_NET_NS_PID of this process). No `ip` binary, no helper
 * process: a few datagrams. The namespace, and the veth pair with it, end
 * with the last process in it.
 */
#include "workerd.h"

#include "netlink.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parses MUSTER_NETNS, "BRIDGE GATEWAY/PREFIX". Returns 0 or -1. */
static int netns_parse(const char *v, char *bridge, size_t blen, struct in_addr *gw, int *prefix) {
  char gws[32];
  const char *sp = strchr(v, ' ');
  const char *slash = sp ? strchr(sp, '/') : NULL;
  char *end;
  long n;

  if (!sp || !slash || (size_t)(sp - v) >= blen || (size_t)(slash - sp - 1) >= sizeof(gws))
    return -1;
  memcpy(bridge, v, (size_t)(sp - v));
  bridge[sp - v] = '\0';
  memcpy(gws, sp + 1, (size_t)(slash - sp - 1));
  gws[slash - sp - 1] = '\0';
  n = strtol(slash + 1, &end, 10);
  if (inet_pton(AF_INET, gws, gw) != 1 || *end || n < 8 || n > 30)
    return -1;
  *prefix = (int)n;
  return 0;
}

int wd_netns_enter(void) {
  const char *v = getenv("MUSTER_NETNS");
  const char *ip_s = getenv("MUSTER_BIND_IP");
  char bridge[32], host_end[NL_VETH_NAME_MAX];
  struct in_addr gw, ip;
  int prefix, host = -1, ns = -1, br, rc = -1, e = 0, lo, eth;
  const char *step = "";

  if (!v || !*v)
    return 0;
  if (netns_parse(v, bridge, sizeof(bridge), &gw, &prefix) != 0 || !ip_s ||
      inet_pton(AF_INET, ip_s, &ip) != 1) {
    fprintf(stderr, "muster-workerd: MUSTER_NETNS \"%s\" or MUSTER_BIND_IP is not valid\n", v);
    return -1;
  }
  nl_worker_veth_name(ip, host_end);
  step = "open a netlink socket";
  host = nl_open();
  if (host < 0) {
    e = -host;
    goto out;
  }
  step = "find the bridge";
  br = nl_link_index(host, bridge);
  if (br < 0) {
    e = -br;
    goto out;
  }
  step = "make a network namespace";
  if (unshare(CLONE_NEWNET) != 0) {
    e = errno;
    goto out;
  }
  step = "make its veth pair";
  e = -nl_veth_add(host, host_end, br, "eth0", getpid());
  /* A namespace that ended a moment ago may not have taken its pair along
   * yet (the kernel tears namespaces down in the background; the
   * controller ends an earlier attempt's processes before it starts a new
   * one): the address is this worker's now, so is the name. */
  for (int waited = 0, said = 0; e == EEXIST && waited < 2000; waited += 20) {
    int old = nl_link_index(host, host_end), del = old > 0 ? nl_link_del(host, old) : old;

    if (del == 0 && !said++)
      fprintf(stderr, "muster-workerd: the veth %s of address %s was still there: it was removed\n",
              host_end, ip_s);
    /* (gone meanwhile, or removed: the name is free, unless the kernel
     * has not let go of it yet) */
    if (del == 0 || del == -ENODEV)
      e = -nl_veth_add(host, host_end, br, "eth0", getpid());
    else
      e = -del; /* (what stands in the way, said as it is) */
    if (e == EEXIST)
      usleep(20 * 1000);
  }
  if (e)
    goto out;
  step = "configure its own namespace";
  ns = nl_open();
  if (ns < 0) {
    e = -ns;
    goto out;
  }
  lo = nl_link_index(ns, "lo");
  eth = nl_link_index(ns, "eth0");
  if (lo < 0 || eth < 0) {
    e = lo < 0 ? -lo : -eth;
    goto out;
  }
  e = -nl_link_up(ns, lo);
  if (!e)
    e = -nl_addr_add(ns, eth, ip, prefix);
  if (!e)
    e = -nl_link_up(ns, eth);
  if (!e)
    e = -nl_route_default(ns, gw);
  if (!e) {
    /* Libraries that pick their interface by resolving the host's name
     * (PyTorch's gloo, NCCL, TensorPipe) would find the host's loopback
     * address, which is this namespace's own: the one link out is eth0.
     * The launch's env still wins. */
    setenv("GLOO_SOCKET_IFNAME", "eth0", 0);
    setenv("NCCL_SOCKET_IFNAME", "eth0", 0);
    setenv("TP_SOCKET_IFNAME", "eth0", 0);
    rc = 0;
  }
out:
  if (rc)
    fprintf(stderr, "muster-workerd: cannot %s for address %s on bridge %s: %s\n", step, ip_s,
            bridge, strerror(e ? e : EINVAL));
  if (host >= 0)
    close(host);
  if (ns >= 0)
    close(ns);
  unsetenv("MUSTER_NETNS");
  return rc;
}
