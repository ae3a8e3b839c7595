/*
 * launch_lease.h: muster launch --lease (launch_lease.c), which cmd_launch
 * hands over to once the options are parsed.
 */
#ifndef MUSTER_CLI_LAUNCH_LEASE_H
#define MUSTER_CLI_LAUNCH_LEASE_H

#include "muster.h"

/* Launches o holding its session's lease, prints the workers, and stays
 * until they have all ended (exit 0 if all succeeded) or a signal comes
 * (they are stopped at once). If this process dies, the lease runs out
 * and the controller stops them. c stays the caller's. Returns the
 * process exit code. */
int launch_leased(muster_client *c, const muster_launch_opts *o, double ttl, int as_json);

#endif
