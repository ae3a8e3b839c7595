/*
 * zygote_proto.h: the protocol between the controller's local backend
 * (controller/local_zygote.c, local_zygote_start() and local_zygote_send()) and
 * workerd's fork server (workerd/zygote.c, `muster-workerd --zygote`), in
 * one place so that the two ends cannot drift.
 *
 * The backend starts `muster-workerd ZYGOTE_ARG` with one end of a
 * SOCK_SEQPACKET socket pair as its fd ZYGOTE_FD. Every message is one
 * datagram:
 *
 *   fork server -> backend, once: a pid_t ZYGOTE_HELLO (ready, and a fork
 *     server at all);
 *   backend -> fork server, a request: NUL-terminated "NAME=value" strings,
 *     at most ZYGOTE_REQ_MAX bytes in all: the worker's settings (its
 *     environment) and ZYGOTE_LOG_FILE, where its stdout and stderr go;
 *   fork server -> backend, the answer to each request, in order: a pid_t,
 *     the worker's pid (> 0), or -errno if it could not fork.
 *
 * The fork server ends when the backend closes its end.
 */
#ifndef MUSTER_ZYGOTE_PROTO_H
#define MUSTER_ZYGOTE_PROTO_H

#define ZYGOTE_ARG "--zygote"             /* workerd's argument: be a fork server */
#define ZYGOTE_FD 3                       /* the fork server's end of the socket pair */
#define ZYGOTE_HELLO 0                    /* the first datagram, as a pid_t */
#define ZYGOTE_REQ_MAX 16383              /* most bytes of one request */
#define ZYGOTE_LOG_FILE "MUSTER_LOG_FILE" /* the request's name for the log file */

#endif
