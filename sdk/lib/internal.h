/* internal.h: what the parts of libmuster share that is not its API. */
#ifndef MUSTER_SDK_INTERNAL_H
#define MUSTER_SDK_INTERNAL_H

#include "muster.h"

#include <jansson.h>

/* On the functions the library's files share with each other (and not
 * with its users): they stay out of libmuster.so's exported symbols, as
 * they were when each was static in one file. */
#define MUSTER_INTERNAL __attribute__((visibility("hidden")))

/* The API token of c (borrowed), so run.c can open a second client. */
MUSTER_INTERNAL const char *muster_client_token_(const muster_client *c);

/* A JSON call of c (req: a reference it takes, or NULL), with c's timeout;
 * *answer (if answer is not NULL) gets the answer's JSON (caller frees).
 * Returns 0 or an error, recorded in c. */
MUSTER_INTERNAL int muster_json_call_(muster_client *c, const char *method, const char *path,
                                      json_t *req, json_t **answer)
    __attribute__((warn_unused_result));
/* The HTTP status of c's last answer (0: none came). */
MUSTER_INTERNAL long muster_last_status_(const muster_client *c);
/* muster_lease_start(), with stop_workers 0 for a part that keeps no
 * workers and only binds its holder's runs (a run without a lease). */
MUSTER_INTERNAL int muster_lease_start_(muster_client *c, const char *session, double ttl,
                                        int stop_workers, muster_lease **out)
    __attribute__((warn_unused_result));
/* Records an error in c and returns err. */
MUSTER_INTERNAL int muster_set_error_(muster_client *c, int err, const char *field,
                                      const char *msg);

#endif
