/* api_users.c: who a call comes from (GET /api/v1/whoami). The users
 * themselves are managed with `muster-controller user` (user_cmd.c). */
#include "api_internal.h"

static enum MHD_Result api_whoami(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  return api_respond_json(c, MHD_HTTP_OK,
                          json_pack("{s:s, s:b}", "user",
                                    rq->who.name[0] ? rq->who.name : USER_BOOTSTRAP, "admin",
                                    rq->who.admin));
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_users_routes[] = {
    {"GET", "/api/v1/whoami", AUTH_CLIENT, api_whoami, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
