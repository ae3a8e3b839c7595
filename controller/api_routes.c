/* api_routes.c: the REST API's route tables, one per handler file, for the
 * router (api_http.c) to walk. Nothing here is called: a new handler file
 * adds its table to this list. See api_internal.h. */
#include "api_internal.h"

#include <stddef.h>

const struct api_route *const api_route_tables[] = {
    api_health_routes,
    api_worker_routes,
    api_launch_routes,
    api_list_routes,
    api_await_routes,
    api_stop_routes,
    api_stream_routes,
    api_sessions_routes,
    api_runs_routes,
    api_users_routes,
    api_claim_routes,
    api_metrics_routes,
    NULL,
};
