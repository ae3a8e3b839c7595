/*
 * hostport.c: "host:port" and comma-separated lists of them (hostport.h).
 */
#include "hostport.h"

#include <string.h>

int hostport_split(const char *s, size_t len, char *host, size_t hostcap, int port_min, int *port) {
  const char *colon = len ? memrchr(s, ':', len) : NULL;
  const char *h = s, *p;
  size_t hl, pl;
  long v = 0;

  if (!colon)
    return -1;
  hl = (size_t)(colon - s);
  p = colon + 1;
  pl = len - hl - 1;
  if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
    h = s + 1;
    hl -= 2;
  }
  if (hl == 0 || hl >= hostcap || memchr(h, '\0', hl) || pl == 0 || pl > 5)
    return -1;
  for (size_t i = 0; i < pl; i++) {
    if (p[i] < '0' || p[i] > '9')
      return -1;
    v = v * 10 + (p[i] - '0');
  }
  if (v < port_min || v > 65535)
    return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  *port = (int)v;
  return 0;
}

int hostport_list_find(const char *list, const char *host, long index, char *hostout,
                       size_t hostcap, int *port) {
  if (!host && index < 0)
    return -1;
  for (const char *p = list; p && *p; index--) {
    size_t len = strcspn(p, ",");

    if (hostport_split(p, len, hostout, hostcap, 1, port) == 0 &&
        (host ? strcmp(hostout, host) == 0 : index == 0))
      return 0;
    p += len;
    if (*p == ',')
      p++;
  }
  return -1;
}
