/* fuzz_sse.c: libFuzzer target for libmuster's server-sent-event parser
 * (events_write() and sse_record() in sdk/lib/events.c, included here to
 * reach its static functions). The input is fed in chunks of the sizes its
 * first byte picks, as a network would split it; the callback sees every
 * event. Any crash, leak or undefined behaviour is a finding. */
#include "../../sdk/lib/events.c"

static int seen(void *arg, const muster_event *ev) {
  size_t *n = arg;

  /* Touch what the callback is given, as a client would. */
  *n += strlen(ev->worker_id) + (ev->at ? strlen(ev->at) : 0) +
        (ev->detail ? strlen(ev->detail) : 0) + (size_t)(ev->from + ev->to);
  return ev->seq == 424242; /* a callback may also stop the stream */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t n = 0, off = 1, step;
  struct events_ctx e = {.cb = seen, .arg = &n};

  if (size < 1)
    return 0;
  step = (size_t)data[0] % 64 + 1;
  while (off < size && !e.stopped) {
    size_t k = size - off < step ? size - off : step;
    if (events_write((char *)data + off, 1, k, &e) != k)
      break;
    off += k;
  }
  free(e.rec);
  return 0;
}
