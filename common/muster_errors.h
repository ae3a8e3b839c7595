/*
 * muster_errors.h: the one error table shared by every part of muster.
 *
 * Each row is X(SYMBOL, number, "snake_name", http_status, "message").
 * The enum, muster_strerror(), muster_error_name() and the HTTP status that
 * the controller answers with are all generated from it, so they can never
 * drift apart. REST error bodies carry "snake_name"; the SDK maps it back
 * with muster_error_from_name(). Never renumber a row; retire it instead.
 */
#ifndef MUSTER_ERRORS_H
#define MUSTER_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

#define MUSTER_ERRORS(X)                                                                           \
  X(NOMEM, 1, "out_of_memory", 500, "out of memory")                                               \
  X(MALFORMED, 2, "malformed_request", 400, "the request is malformed")                            \
  X(UNAUTHORIZED, 3, "unauthorized", 401, "a valid bearer token is required")                      \
  X(FORBIDDEN, 4, "forbidden", 403, "this token is not allowed to do that")                        \
  X(NOT_FOUND, 5, "not_found", 404, "no such resource")                                            \
  X(CONFLICT, 6, "illegal_transition", 409, "the worker's state does not allow this")              \
  X(TOO_LARGE, 7, "body_too_large", 413, "the request body is larger than 1 MiB")                  \
  X(INVALID, 8, "invalid_value", 422, "a field has an invalid value")                              \
  X(SHUTTING_DOWN, 9, "shutting_down", 503, "the controller is shutting down")                     \
  X(INTERNAL, 10, "internal_error", 500, "internal error")                                         \
  X(DB, 11, "database_error", 500, "the database failed")                                          \
  X(SCHEMA_TOO_NEW, 12, "schema_too_new", 500, "the database was written by a newer muster")       \
  X(IO, 13, "io_error", 500, "an input/output operation failed")                                   \
  X(UNREACHABLE, 14, "unreachable", 503, "the controller could not be reached")                    \
  X(TIMEOUT, 15, "timeout", 504, "the operation timed out")                                        \
  X(METHOD, 16, "method_not_allowed", 405, "method not allowed on this path")                      \
  X(CAPACITY, 17, "exceeds_capacity", 422, "the request can never fit the backend's capacity")     \
  X(PROTOCOL, 18, "protocol_error", 502, "the peer answered something unexpected")                 \
  X(BACKEND, 19, "backend_error", 500, "the backend failed")                                       \
  X(BACKEND_DOWN, 20, "backend_unavailable", 503, "the backend cannot be reached")

/* Every error is a negative int; 0 (MUSTER_OK) is success. */
typedef enum muster_error {
  MUSTER_OK = 0,
#define MUSTER_X_ENUM(sym, num, name, status, msg) MUSTER_E_##sym = -(num),
  MUSTER_ERRORS(MUSTER_X_ENUM)
#undef MUSTER_X_ENUM
} muster_error;

/* A static sentence describing err; never NULL (unknown codes get one). */
const char *muster_strerror(int err);

/* The snake_case name of err, as carried in REST error bodies. */
const char *muster_error_name(int err);

/* The HTTP status the controller answers err with (500 for unknown). */
int muster_error_http_status(int err);

/* The error whose name is name, or MUSTER_E_PROTOCOL if none matches. */
int muster_error_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
