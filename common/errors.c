/* errors.c: functions generated from the error table in muster_errors.h. */
#include "muster_errors.h"

#include <string.h>

const char *muster_strerror(int err) {
  switch ((muster_error)err) {
  case MUSTER_OK:
    return "success";
#define X(sym, num, name, status, msg)                                                             \
  case MUSTER_E_##sym:                                                                             \
    return msg;
    MUSTER_ERRORS(X)
#undef X
  }
  return "unknown error";
}

const char *muster_error_name(int err) {
  switch ((muster_error)err) {
  case MUSTER_OK:
    return "ok";
#define X(sym, num, name, status, msg)                                                             \
  case MUSTER_E_##sym:                                                                             \
    return name;
    MUSTER_ERRORS(X)
#undef X
  }
  return "unknown_error";
}

int muster_error_http_status(int err) {
  switch ((muster_error)err) {
  case MUSTER_OK:
    return 200;
#define X(sym, num, name, status, msg)                                                             \
  case MUSTER_E_##sym:                                                                             \
    return status;
    MUSTER_ERRORS(X)
#undef X
  }
  return 500;
}

int muster_error_from_name(const char *name) {
  if (!name)
    return MUSTER_E_PROTOCOL;
#define X(sym, num, ename, status, msg)                                                            \
  if (strcmp(name, ename) == 0)                                                                    \
    return MUSTER_E_##sym;
  MUSTER_ERRORS(X)
#undef X
  return MUSTER_E_PROTOCOL;
}
