/*
 * network.c: the local workers' network, decided once at start (see
 * network.h). The bridge is made here, with rtnetlink (common/netlink.h);
 * each worker's namespace and veth pair are workerd's (workerd/netns.c).
 */
#include "network.h"

#include "log.h"
#include "muster_errors.h"
#include "netlink.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_DIR "/run/muster"

static struct {
  int bridge;
  char reason[300];
  struct subnet sn;
  char gateway[16], name[16], cidr[32], setting[64];
  int lock_fd;
} net = {.lock_fd = -1};

/* Takes the bridge's lock, held until this process ends. */
static int take_lock(char *err, size_t errlen) {
  char path[64];
  int fd;

  struct stat st;

  /* Root's alone: a lock anyone could open, anyone could hold, and keep
   * every controller of this bridge from starting. */
  if ((mkdir(LOCK_DIR, 0700) != 0 && errno != EEXIST) || lstat(LOCK_DIR, &st) != 0) {
    snprintf(err, errlen, "cannot make %s: %s", LOCK_DIR, strerror(errno));
    return MUSTER_E_IO;
  }
  if (S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) != 0 &&
      chmod(LOCK_DIR, 0700) == 0)
    st.st_mode &= ~(mode_t)077;
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    snprintf(err, errlen,
             "%s must be a directory of this controller's account, mode 0700 (it is owner uid "
             "%u, mode %04o): remove it, and this controller makes it",
             LOCK_DIR, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    return MUSTER_E_INVALID;
  }
  snprintf(path, sizeof(path), "%s/%s.lock", LOCK_DIR, net.name);
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || fchmod(fd, 0600) != 0) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return MUSTER_E_IO;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    snprintf(err, errlen,
             "another muster-controller already serves workers on bridge %s (subnet %s; it holds "
             "%s): give this one another subnet (--subnet CIDR) or --network host",
             net.name, net.cidr, path);
    close(fd);
    return MUSTER_E_INVALID;
  }
  net.lock_fd = fd;
  return 0;
}

/* A subnet of the host's (on any link but our bridge) that overlaps ours
 * would send some workers' packets elsewhere: refused, naming it. */
static int check_overlap(char *err, size_t errlen) {
  struct ifaddrs *all, *a;
  int rc = 0;

  if (getifaddrs(&all) != 0)
    return 0; /* nothing known to overlap */
  for (a = all; a && !rc; a = a->ifa_next) {
    uint32_t ip, mask, ours = 0xffffffffu << (32 - net.sn.prefix), both;

    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_netmask ||
        strcmp(a->ifa_name, net.name) == 0)
      continue;
    ip = ntohl(((struct sockaddr_in *)a->ifa_addr)->sin_addr.s_addr);
    mask = ntohl(((struct sockaddr_in *)a->ifa_netmask)->sin_addr.s_addr);
    both = mask & ours;
    if ((ip & both) == (net.sn.base & both)) {
      char s[16];
      inet_ntop(AF_INET, &((struct sockaddr_in *)a->ifa_addr)->sin_addr, s, sizeof(s));
      snprintf(err, errlen, "--subnet %s overlaps %s's address %s/%d: choose another subnet",
               net.cidr, a->ifa_name, s, __builtin_popcount(mask));
      rc = MUSTER_E_INVALID;
    }
  }
  freeifaddrs(all);
  return rc;
}

/* Makes the bridge (if it is not there), gives it the gateway's address
 * and sets it up. Returns 0, or -errno with what failed in *step. */
static int bridge_up(const char **step) {
  unsigned char mac[6] = {0x02, 0x6d};
  struct in_addr gw = {.s_addr = htonl(subnet_gateway(&net.sn))};
  int fd = nl_open(), idx, rc;

  *step = "open a netlink socket";
  if (fd < 0)
    return fd;
  /* A fixed address: a bridge takes its lowest port's otherwise, and
   * workers' ARP caches would hold the gateway's old one. */
  memcpy(mac + 2, &gw.s_addr, 4);
  *step = "make the bridge";
  rc = nl_bridge_add(fd, net.name, mac);
  if (rc == -EEXIST)
    rc = 0; /* left by an earlier controller, as docker0 is */
  idx = rc ? rc : nl_link_index(fd, net.name);
  if (idx < 0) {
    rc = idx;
    goto out;
  }
  *step = "give the bridge its address";
  rc = nl_addr_add(fd, idx, gw, net.sn.prefix);
  if (rc == -EEXIST)
    rc = 0;
  if (!rc) {
    *step = "set the bridge up";
    rc = nl_link_up(fd, idx);
  }
  /* Nothing the workers send is routed on to another link, even on a host
   * that forwards (ip_forward=1): they reach this host and each other. */
  if (!rc) {
    char path[96];
    int f;
    *step = "stop forwarding from the bridge";
    snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/%s/forwarding", net.name);
    f = open(path, O_WRONLY | O_CLOEXEC);
    if (f < 0 || write(f, "0", 1) != 1)
      rc = -errno;
    if (f >= 0)
      close(f);
  }
out:
  close(fd);
  return rc;
}

int net_setup(enum net_choice choice, const char *cidr, const char *backend, char *err,
              size_t errlen) {
  const char *step = "";
  int rc;

  net.bridge = 0;
  if (subnet_parse(cidr && *cidr ? cidr : SUBNET_DEFAULT, &net.sn, err, errlen) != 0) {
    char why[200];
    snprintf(why, sizeof(why), "%s", err);
    snprintf(err, errlen, "--subnet: %s", why);
    return MUSTER_E_INVALID;
  }
  if (choice == NET_HOST) {
    snprintf(net.reason, sizeof(net.reason), "--network host");
    return 0;
  }
  if (strcmp(backend, "local") != 0) {
    snprintf(net.reason, sizeof(net.reason),
             "the %s backend's workers are on their hosts' own networks", backend);
    if (choice == NET_BRIDGE) {
      snprintf(err, errlen, "--network bridge needs the local backend, not %s", backend);
      return MUSTER_E_INVALID;
    }
    return 0;
  }
  if (geteuid() != 0) {
    snprintf(net.reason, sizeof(net.reason),
             "a controller not run as root cannot give workers network namespaces on a bridge");
    if (choice == NET_BRIDGE) {
      snprintf(err, errlen, "--network bridge: %s", net.reason);
      return MUSTER_E_INVALID;
    }
    return 0;
  }
  subnet_format(&net.sn, net.cidr, sizeof(net.cidr));
  subnet_bridge_name(&net.sn, net.name, sizeof(net.name));
  {
    struct in_addr gw = {.s_addr = htonl(subnet_gateway(&net.sn))};
    inet_ntop(AF_INET, &gw, net.gateway, sizeof(net.gateway));
  }
  rc = take_lock(err, errlen);
  if (!rc)
    rc = check_overlap(err, errlen);
  if (rc)
    return rc;
  rc = bridge_up(&step);
  if (rc) {
    snprintf(net.reason, sizeof(net.reason), "the kernel refused to %s %s: %s", step, net.name,
             strerror(-rc));
    if (choice == NET_BRIDGE) {
      snprintf(err, errlen, "--network bridge: %s", net.reason);
      return MUSTER_E_BACKEND;
    }
    close(net.lock_fd);
    net.lock_fd = -1;
    net.gateway[0] = net.name[0] = net.cidr[0] = '\0';
    return 0;
  }
  snprintf(net.setting, sizeof(net.setting), "%s %s/%d", net.name, net.gateway, net.sn.prefix);
  net.reason[0] = '\0';
  net.bridge = 1;
  return 0;
}

int net_bridge(void) {
  return net.bridge;
}

const char *net_mode(void) {
  return net.bridge ? "bridge" : "host";
}

const char *net_reason(void) {
  return net.bridge ? NULL : net.reason;
}

const char *net_gateway(void) {
  return net.bridge ? net.gateway : "";
}

const char *net_bridge_name(void) {
  return net.bridge ? net.name : "";
}

const char *net_subnet_text(void) {
  return net.bridge ? net.cidr : "";
}

const char *net_workerd_setting(void) {
  return net.bridge ? net.setting : "";
}

int net_slots(int cap) {
  return net.bridge ? subnet_slots(&net.sn, cap) : cap;
}

void net_slot_ip(int slot, char *buf, size_t size) {
  if (net.bridge)
    subnet_slot_ip(&net.sn, slot, buf, size);
  else
    snprintf(buf, size, "127.0.%d.%d", 1 + slot / 254, 1 + slot % 254);
}

int net_ip_slot(const char *ip) {
  unsigned a, b;
  char tail;

  if (net.bridge)
    return subnet_ip_slot(&net.sn, ip);
  if (sscanf(ip, "127.0.%u.%u%c", &a, &b, &tail) != 2 || a < 1 || a > 254 || b < 1 || b > 254)
    return -1;
  return (int)((a - 1) * 254 + (b - 1));
}
