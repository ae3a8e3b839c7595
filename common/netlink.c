/*
 * netlink.c: rtnetlink requests for workers' network namespaces (see
 * netlink.h). Each request is built in a fixed buffer (every request here
 * is a few hundred bytes at most), sent, and its ACK read.
 */
#include "netlink.h"

#include <errno.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define NL_BUF 1024

struct nlreq {
  union {
    struct nlmsghdr h;
    char buf[NL_BUF];
  } u;
  int overflow; /* an attribute did not fit: the request is not sent */
};

static void req_init(struct nlreq *r, int type, int flags, const void *body, size_t len) {
  memset(r, 0, sizeof(*r));
  r->u.h.nlmsg_len = NLMSG_LENGTH(len);
  r->u.h.nlmsg_type = (unsigned short)type;
  r->u.h.nlmsg_flags = (unsigned short)(NLM_F_REQUEST | NLM_F_ACK | flags);
  memcpy(NLMSG_DATA(&r->u.h), body, len);
}

/* Appends attribute type with len bytes of data; returns it (for nesting),
 * or NULL when the buffer is full. */
static struct rtattr *attr_add(struct nlreq *r, int type, const void *data, size_t len) {
  size_t at = NLMSG_ALIGN(r->u.h.nlmsg_len);
  struct rtattr *a = (struct rtattr *)(r->u.buf + at);

  if (at + RTA_SPACE(len) > sizeof(r->u.buf)) {
    r->overflow = 1;
    return NULL;
  }
  a->rta_type = (unsigned short)type;
  a->rta_len = (unsigned short)RTA_LENGTH(len);
  if (len)
    memcpy(RTA_DATA(a), data, len);
  r->u.h.nlmsg_len = (unsigned)(at + RTA_SPACE(len));
  return a;
}

/* Ends a nested attribute begun by attr_add(r, type, NULL, 0). */
static void nest_end(struct nlreq *r, struct rtattr *a) {
  if (a)
    a->rta_len = (unsigned short)(r->u.buf + r->u.h.nlmsg_len - (char *)a);
}

/* One datagram of the kernel's into buf: its length, or -errno (-EMSGSIZE
 * for one larger than buf, -ETIMEDOUT after nl_open()'s 5 s). */
static ssize_t nl_recv(int fd, char *buf, size_t size) {
  for (;;) {
    ssize_t n = recv(fd, buf, size, MSG_TRUNC);

    if (n >= 0)
      return (size_t)n > size ? -EMSGSIZE : n;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return -ETIMEDOUT;
    if (errno != EINTR)
      return -errno;
  }
}

/* Sends r and reads the kernel's answer to it: its ACK (0) or error
 * (-errno); with index, a link's description instead, whose index goes
 * there. */
static int req_send(int fd, struct nlreq *r, int *index) {
  struct sockaddr_nl to = {.nl_family = AF_NETLINK};
  char ans[8192]; /* (a link's description is a few KiB) */
  static unsigned seq;
  unsigned my;

  if (r->overflow)
    return -EMSGSIZE;
  my = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
  r->u.h.nlmsg_seq = my;
  if (sendto(fd, r->u.buf, r->u.h.nlmsg_len, 0, (struct sockaddr *)&to, sizeof(to)) < 0)
    return -errno;
  for (;;) {
    ssize_t n = nl_recv(fd, ans, sizeof(ans));
    struct nlmsghdr *h = (struct nlmsghdr *)ans;

    if (n < 0)
      return (int)n;
    for (; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != my)
        continue; /* an answer to an earlier request that gave up */
      if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = NLMSG_DATA(h);
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*e)))
          return -EBADMSG;
        return e->error || !index ? e->error : -ENODEV; /* 0: the ACK */
      }
      if (index && h->nlmsg_type == RTM_NEWLINK) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifinfomsg)))
          return -EBADMSG;
        *index = ((const struct ifinfomsg *)NLMSG_DATA(h))->ifi_index;
        return 0;
      }
    }
  }
}

int nl_open(void) {
  struct sockaddr_nl me = {.nl_family = AF_NETLINK};
  struct timeval wait = {.tv_sec = 5};
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);

  if (fd < 0)
    return -errno;
  /* (the kernel answers at once; no wait is without an end) */
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait)) != 0 ||
      bind(fd, (struct sockaddr *)&me, sizeof(me)) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

int nl_link_index(int fd, const char *name) {
  struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC};
  struct nlreq r;
  int index = 0, rc;

  req_init(&r, RTM_GETLINK, 0, &ifi, sizeof(ifi));
  r.u.h.nlmsg_flags = NLM_F_REQUEST; /* the answer is the link itself, or an error */
  attr_add(&r, IFLA_IFNAME, name, strlen(name) + 1);
  rc = req_send(fd, &r, &index);
  return rc ? rc : index;
}

int nl_bridge_add(int fd, const char *name, const unsigned char mac[6]) {
  struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC};
  struct nlreq r;
  struct rtattr *info;

  req_init(&r, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifi, sizeof(ifi));
  attr_add(&r, IFLA_IFNAME, name, strlen(name) + 1);
  attr_add(&r, IFLA_ADDRESS, mac, 6);
  info = attr_add(&r, IFLA_LINKINFO, NULL, 0);
  attr_add(&r, IFLA_INFO_KIND, "bridge", strlen("bridge"));
  nest_end(&r, info);
  return req_send(fd, &r, NULL);
}

int nl_veth_add(int fd, const char *name, int master, const char *peer_name, pid_t peer_pid) {
  struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC, .ifi_flags = IFF_UP, .ifi_change = IFF_UP};
  struct ifinfomsg peer = {.ifi_family = AF_UNSPEC};
  struct nlreq r;
  struct rtattr *info, *data, *pa;
  uint32_t m = (uint32_t)master, pid = (uint32_t)peer_pid;

  req_init(&r, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifi, sizeof(ifi));
  attr_add(&r, IFLA_IFNAME, name, strlen(name) + 1);
  if (master > 0)
    attr_add(&r, IFLA_MASTER, &m, sizeof(m));
  info = attr_add(&r, IFLA_LINKINFO, NULL, 0);
  attr_add(&r, IFLA_INFO_KIND, "veth", strlen("veth"));
  data = attr_add(&r, IFLA_INFO_DATA, NULL, 0);
  /* VETH_INFO_PEER holds an ifinfomsg, then the peer's own attributes. */
  pa = attr_add(&r, VETH_INFO_PEER, &peer, sizeof(peer));
  attr_add(&r, IFLA_IFNAME, peer_name, strlen(peer_name) + 1);
  if (peer_pid > 0)
    attr_add(&r, IFLA_NET_NS_PID, &pid, sizeof(pid));
  nest_end(&r, pa);
  nest_end(&r, data);
  nest_end(&r, info);
  return req_send(fd, &r, NULL);
}

int nl_link_up(int fd, int index) {
  struct ifinfomsg ifi = {
      .ifi_family = AF_UNSPEC, .ifi_index = index, .ifi_flags = IFF_UP, .ifi_change = IFF_UP};
  struct nlreq r;

  req_init(&r, RTM_NEWLINK, 0, &ifi, sizeof(ifi));
  return req_send(fd, &r, NULL);
}

int nl_link_del(int fd, int index) {
  struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC, .ifi_index = index};
  struct nlreq r;

  req_init(&r, RTM_DELLINK, 0, &ifi, sizeof(ifi));
  return req_send(fd, &r, NULL);
}

int nl_addr_add(int fd, int index, struct in_addr addr, int prefix) {
  struct ifaddrmsg ifa = {.ifa_family = AF_INET,
                          .ifa_prefixlen = (unsigned char)prefix,
                          .ifa_scope = RT_SCOPE_UNIVERSE,
                          .ifa_index = (unsigned)index};
  struct nlreq r;

  req_init(&r, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &ifa, sizeof(ifa));
  attr_add(&r, IFA_LOCAL, &addr, sizeof(addr));
  attr_add(&r, IFA_ADDRESS, &addr, sizeof(addr));
  return req_send(fd, &r, NULL);
}

int nl_route_default(int fd, struct in_addr gw) {
  struct rtmsg rt = {.rtm_family = AF_INET,
                     .rtm_table = RT_TABLE_MAIN,
                     .rtm_protocol = RTPROT_BOOT,
                     .rtm_scope = RT_SCOPE_UNIVERSE,
                     .rtm_type = RTN_UNICAST};
  struct nlreq r;

  req_init(&r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &rt, sizeof(rt));
  attr_add(&r, RTA_GATEWAY, &gw, sizeof(gw));
  return req_send(fd, &r, NULL);
}
