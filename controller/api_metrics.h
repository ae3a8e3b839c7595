/* api_metrics.h: what api_metrics.c (the metrics' routes) shares with
 * api_metrics_follow.c (a followed read), which calls nothing back. */
#ifndef MUSTER_API_METRICS_H
#define MUSTER_API_METRICS_H

#include "api_internal.h"

/* The most names a point holds, a read names, and their comma list. */
#define METRICS_POINT_NAMES 64
#define METRIC_NAME_MAX 64
#define METRICS_LIST_MAX (METRICS_POINT_NAMES * (METRIC_NAME_MAX + 1) + 1)

/* Answers a followed read of run's metrics (q: what it asks for; list: its
 * names, checked, as a comma list, or NULL) with server-sent events. */
enum MHD_Result api_metrics_follow(struct MHD_Connection *c, const char *run, const char *list,
                                   const struct db_metric_query *q);

#endif
