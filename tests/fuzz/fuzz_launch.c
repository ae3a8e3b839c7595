/* fuzz_launch.c: libFuzzer target for the controller's request bodies and
 * path pieces: the launch and await validators (validate.c), and the worker
 * id and name checks the routes use. Any crash, leak or undefined behaviour
 * is a finding. */
#include "validate.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char msg[512], *s;
  const char *field = NULL;
  json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);

  if (body) {
    struct launch_req lr;
    struct await_req ar;

    if (json_is_object(body)) {
      (void)validate_launch(body, &lr, &field, msg, sizeof(msg));
      if (validate_await(body, &ar, &field, msg, sizeof(msg)) == 0)
        json_decref(ar.ids);
    }
    json_decref(body);
  }
  s = malloc(size + 1);
  if (!s)
    return 0;
  memcpy(s, data, size);
  s[size] = '\0';
  (void)validate_worker_id(s);
  (void)validate_name(s);
  (void)validate_kernel_code_flag(s);
  free(s);
  return 0;
}
