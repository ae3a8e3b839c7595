/* account.h: the account a worker's code runs as when none is named.
 *
 * A controller or workerd run as root never runs a worker's code as root:
 * without --run-as (MUSTER_RUN_AS) it uses this account, which
 * scripts/setup.sh makes, and refuses to start where it does not exist. */
#ifndef MUSTER_ACCOUNT_H
#define MUSTER_ACCOUNT_H

#define MUSTER_DEFAULT_ACCOUNT "muster-worker"

#endif
