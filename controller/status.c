/* status.c: the worker statuses (muster_status.h's one table): their
 * names, which are terminal, and which moves between them the state machine
 * allows. See state.h. */
#include "state.h"

#include "muster_errors.h"

#include <string.h>

static const char *const status_names[WS_COUNT_] = {
#define MUSTER_X_STATUS(sym, name, terminal) name,
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
};

static const unsigned char status_terminal[WS_COUNT_] = {
#define MUSTER_X_STATUS(sym, name, terminal) terminal,
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
};

const char *ws_name(enum wstatus s) {
  return s < WS_COUNT_ ? status_names[s] : "?";
}

int ws_parse(const char *name, enum wstatus *out) {
  for (int i = 0; i < WS_COUNT_; i++)
    if (name && strcmp(name, status_names[i]) == 0) {
      *out = (enum wstatus)i;
      return 0;
    }
  return MUSTER_E_INVALID;
}

int ws_terminal(enum wstatus s) {
  return s < WS_COUNT_ && status_terminal[s];
}

int sm_legal(enum wstatus from, enum wstatus to) {
  switch (from) {
  case WS_SCHEDULING:
    /* scheduling -> scheduling: an attempt handed to a backend with a queue
     * of its own, where it waits until that backend starts it. */
    return to == WS_SCHEDULING || to == WS_STARTING || to == WS_FAILED || to == WS_STOPPED;
  case WS_STARTING:
    /* starting -> starting: a new attempt, when a restarted controller
     * finds the recorded one not running (it never registered). */
    return to == WS_STARTING || to == WS_RUNNING || to == WS_FAILED || to == WS_STOPPED;
  case WS_RUNNING:
    return to == WS_SUCCEEDED || to == WS_FAILED || to == WS_STOPPED;
  case WS_SUCCEEDED:
  case WS_FAILED:
  case WS_STOPPED:
  case WS_COUNT_:
    return 0;
  }
  return 0;
}
