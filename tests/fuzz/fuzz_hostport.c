/* fuzz_hostport.c: libFuzzer target for the one "host:port" parser
 * (common/hostport.c): the controller's --listen, the trainer's TF_CONFIG
 * addresses and the exec-address lists muster run hands its mpirun. Beyond
 * crashes, it checks what a caller relies on: a host that comes out is
 * never empty and fits its buffer, a port is in range, and an address found
 * in a list is found again by its host. */
#include "hostport.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char host[64], again[64], *s;
  int port, port2;

  if (hostport_split((const char *)data, size, host, sizeof(host), 0, &port) == 0) {
    if (!host[0] || strlen(host) >= sizeof(host) || port < 0 || port > 65535)
      abort();
  }
  s = malloc(size + 1);
  if (!s)
    return 0;
  memcpy(s, data, size);
  s[size] = '\0';
  for (long i = 0; i < 4; i++) {
    if (hostport_list_find(s, NULL, i, host, sizeof(host), &port) != 0)
      continue;
    if (!host[0] || port < 1 || port > 65535)
      abort();
    /* The same host is found by name (the first entry with that host). */
    if (hostport_list_find(s, host, 0, again, sizeof(again), &port2) != 0 || strcmp(host, again))
      abort();
  }
  free(s);
  return 0;
}
