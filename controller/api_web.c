/* api_web.c: the web UI's files, for a GET of any path outside /api/. See
 * api_internal.h. */
#include "api_internal.h"

#include "muster_errors.h"
#include "state.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *content_type(const char *path) {
  const char *dot = strrchr(path, '.');

  if (!dot)
    return "application/octet-stream";
  if (strcmp(dot, ".html") == 0)
    return "text/html; charset=utf-8";
  if (strcmp(dot, ".js") == 0 || strcmp(dot, ".mjs") == 0)
    return "text/javascript; charset=utf-8";
  if (strcmp(dot, ".css") == 0)
    return "text/css; charset=utf-8";
  if (strcmp(dot, ".svg") == 0)
    return "image/svg+xml";
  if (strcmp(dot, ".png") == 0)
    return "image/png";
  if (strcmp(dot, ".json") == 0)
    return "application/json";
  return "application/octet-stream";
}

/* Serves a file of the web UI; the UI holds no data, so no token is needed
 * (every API call it makes needs one). */
static enum MHD_Result api_static(struct MHD_Connection *c, struct req *rq, const char *url) {
  (void)rq;
  char path[1400];
  struct stat st;
  struct MHD_Response *r;
  enum MHD_Result ret;
  int fd;

  if (strcmp(url, "/") == 0)
    url = "/index.html";
  if (strstr(url, "..") || strlen(url) > 200)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such page");
  snprintf(path, sizeof(path), "%s%s", g.cfg.web_dir, url);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0)
      close(fd);
    return api_respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such page: %s", url);
  }
  r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
  if (!r) {
    close(fd);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", content_type(path));
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* The router's answer outside /api/ (GET only). */
const route_fn api_web_fallback = api_static;
