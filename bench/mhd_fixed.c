/*
 * mhd_fixed.c: the reference server of bench/controller: bare
 * libmicrohttpd, set up as muster-controller sets it up (epoll, a thread
 * pool of the same size), answering every request with one fixed body of
 * the given size. What the controller adds on top of it is what it costs.
 *
 *   mhd_fixed BODY_BYTES THREADS      prints its port, serves until killed
 */
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *body;
static size_t body_len;

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  struct MHD_Response *r;
  enum MHD_Result ret;

  (void)cls;
  (void)url;
  (void)method;
  (void)version;
  (void)upload;
  (void)upload_size;
  if (!*con_cls) {
    *con_cls = c;
    return MHD_YES;
  }
  r = MHD_create_response_from_buffer(body_len, body, MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header(r, "Content-Type", "application/json");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

int main(int argc, char **argv) {
  struct MHD_Daemon *d;
  const union MHD_DaemonInfo *info;
  char *end;
  long bytes, threads;
  sigset_t set;
  int sig;

  if (argc != 3 || (bytes = strtol(argv[1], &end, 10)) < 2 || *end ||
      (threads = strtol(argv[2], &end, 10)) < 1 || *end) {
    fprintf(stderr, "usage: mhd_fixed BODY_BYTES THREADS\n");
    return 2;
  }
  body_len = (size_t)bytes;
  body = malloc(body_len);
  memset(body, 'x', body_len);
  body[0] = '"';
  body[body_len - 1] = '"';
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD, 0, NULL, NULL, answer, NULL,
                       MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads, MHD_OPTION_CONNECTION_LIMIT,
                       (unsigned)16000, MHD_OPTION_END);
  if (!d)
    return 1;
  info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  printf("%u\n", info ? info->port : 0);
  fflush(stdout);
  sigwait(&set, &sig);
  MHD_stop_daemon(d);
  free(body);
  return 0;
}
