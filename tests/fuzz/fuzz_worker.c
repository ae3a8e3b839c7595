/* fuzz_worker.c: libFuzzer target for the bodies a worker's muster-workerd
 * sends the controller: its registration and its exit report (validate.c).
 * Any crash, leak or undefined behaviour is a finding; so is an accepted
 * registration whose address is not an address, or an exit report that is
 * accepted with a signal out of range. */
#include "validate.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char msg[512];
  const char *field = NULL;
  json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  struct register_req rr;
  struct exit_req er;
  unsigned char addr[16];

  if (!body)
    return 0;
  if (validate_register(body, &rr, &field, msg, sizeof(msg)) == 0) {
    if (inet_pton(AF_INET, rr.ip_address, addr) != 1 &&
        inet_pton(AF_INET6, rr.ip_address, addr) != 1)
      abort();
    if (rr.exec_port < 0 || rr.exec_port > 65535 || rr.pid < 0 || rr.attempt < 0)
      abort();
    if (rr.hostname && strlen(rr.hostname) > 255)
      abort();
  } else if (!field && json_is_object(body)) {
    abort(); /* a refusal of an object names its field */
  }
  if (validate_exit(body, &er, &field, msg, sizeof(msg)) == 0) {
    if (er.signal < 0 || er.signal > 127 || memchr(er.failure, '\0', sizeof(er.failure)) == NULL)
      abort();
  }
  json_decref(body);
  return 0;
}
