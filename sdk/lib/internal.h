/* internal.h: what the parts of libmuster share that is not its API. */
#ifndef MUSTER_SDK_INTERNAL_H
#define MUSTER_SDK_INTERNAL_H

#include "muster.h"

/* The API token of c (borrowed), so run.c can open a second client. */
const char *muster_client_token_(const muster_client *c);

#endif
