/* subnet.c: the workers' subnet in bridge mode (see subnet.h). */
#include "subnet.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int subnet_parse(const char *cidr, struct subnet *s, char *err, size_t errlen) {
  char addr[32];
  const char *slash = strchr(cidr, '/');
  struct in_addr a;
  char *end;
  long n;
  uint32_t mask;

  if (!slash || (size_t)(slash - cidr) >= sizeof(addr)) {
    snprintf(err, errlen, "\"%.64s\" is not A.B.C.D/N", cidr);
    return -1;
  }
  memcpy(addr, cidr, (size_t)(slash - cidr));
  addr[slash - cidr] = '\0';
  n = strtol(slash + 1, &end, 10);
  if (inet_pton(AF_INET, addr, &a) != 1 || end == slash + 1 || *end) {
    snprintf(err, errlen, "\"%.64s\" is not A.B.C.D/N", cidr);
    return -1;
  }
  if (n < 8 || n > 29) {
    snprintf(err, errlen, "\"%.64s\": the prefix must be 8 to 29 (a gateway and workers)", cidr);
    return -1;
  }
  mask = 0xffffffffu << (32 - n);
  s->base = ntohl(a.s_addr);
  s->prefix = (int)n;
  if (s->base & ~mask) {
    snprintf(err, errlen, "\"%.64s\" has host bits set (the subnet is %u.%u.%u.%u/%ld)", cidr,
             (s->base & mask) >> 24, ((s->base & mask) >> 16) & 255, ((s->base & mask) >> 8) & 255,
             (s->base & mask) & 255, n);
    return -1;
  }
  return 0;
}

static void dotted(uint32_t a, char *buf, size_t size) {
  snprintf(buf, size, "%u.%u.%u.%u", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
}

void subnet_format(const struct subnet *s, char *buf, size_t size) {
  char a[16];

  dotted(s->base, a, sizeof(a));
  snprintf(buf, size, "%s/%d", a, s->prefix);
}

void subnet_bridge_name(const struct subnet *s, char *buf, size_t size) {
  char cidr[32];

  subnet_format(s, cidr, sizeof(cidr));
  if (strcmp(cidr, SUBNET_DEFAULT) == 0)
    snprintf(buf, size, "%s", SUBNET_DEFAULT_BRIDGE);
  else
    snprintf(buf, size, "mu%08x%02x", (unsigned)s->base, (unsigned)s->prefix);
}

uint32_t subnet_gateway(const struct subnet *s) {
  return s->base + 1;
}

int subnet_slots(const struct subnet *s, int cap) {
  /* all addresses less the network's, the gateway's and the broadcast */
  uint32_t n = (1u << (32 - s->prefix)) - 3;

  return n > (uint32_t)cap ? cap : (int)n;
}

void subnet_slot_ip(const struct subnet *s, int slot, char *buf, size_t size) {
  dotted(s->base + 2 + (uint32_t)slot, buf, size);
}

int subnet_ip_slot(const struct subnet *s, const char *ip) {
  struct in_addr a;
  uint32_t h, mask = 0xffffffffu << (32 - s->prefix);

  if (inet_pton(AF_INET, ip, &a) != 1)
    return -1;
  h = ntohl(a.s_addr);
  if ((h & mask) != s->base || h - s->base < 2 || h - s->base > (~mask) - 1)
    return -1;
  return (int)(h - s->base - 2);
}
