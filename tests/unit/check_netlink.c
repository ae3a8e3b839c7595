/* check_netlink.c: the rtnetlink requests of common/netlink.h make a
 * working bridge, a veth pair into another network namespace, addresses
 * and a default route (a TCP connection goes through them), all inside a
 * network namespace of the test's own, so the host's is never touched;
 * and common/subnet.h's parsing, bridge names and address slots. */
#include "netlink.h"
#include "subnet.h"

#include "../check_run.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct in_addr ip(const char *s) {
  struct in_addr a;

  ck_assert_int_eq(inet_pton(AF_INET, s, &a), 1);
  return a;
}

/* The worker's side, in a namespace of its own: waits for its eth0, sets
 * it up as workerd does, and connects to the gateway's port. Exit 0 when
 * the connection was made. */
static int worker_side(int ready_fd, int port) {
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  char c;
  int fd, eth, lo, s;

  if (read(ready_fd, &c, 1) != 1)
    return 10;
  fd = nl_open();
  if (fd < 0)
    return 11;
  eth = nl_link_index(fd, "eth0");
  lo = nl_link_index(fd, "lo");
  if (eth <= 0 || lo <= 0)
    return 12;
  if (nl_link_up(fd, lo) != 0 || nl_addr_add(fd, eth, ip("10.9.0.2"), 24) != 0 ||
      nl_link_up(fd, eth) != 0 || nl_route_default(fd, ip("10.9.0.1")) != 0)
    return 13;
  /* a second address of the same is refused: the caller knows it is there */
  if (nl_addr_add(fd, eth, ip("10.9.0.2"), 24) != -EEXIST)
    return 14;
  close(fd);
  to.sin_addr = ip("10.9.0.1");
  s = socket(AF_INET, SOCK_STREAM, 0);
  return s >= 0 && connect(s, (struct sockaddr *)&to, sizeof(to)) == 0 ? 0 : 15;
}

/* The whole path, in the test's own network namespace. Exit codes name
 * the step that failed; 77: no namespace could be made (not root). */
static int bridge_and_veth(void) {
  static const unsigned char mac[6] = {0x02, 0x6d, 10, 9, 0, 1};
  struct sockaddr_in at = {.sin_family = AF_INET};
  socklen_t len = sizeof(at);
  int fd, br, ls, pipefd[2], status, veth;
  pid_t w;

  if (unshare(CLONE_NEWNET) != 0)
    return 77;
  fd = nl_open();
  if (fd < 0)
    return 1;
  if (nl_bridge_add(fd, "tb0", mac) != 0)
    return 2;
  if (nl_bridge_add(fd, "tb0", mac) != -EEXIST)
    return 3;
  br = nl_link_index(fd, "tb0");
  if (br <= 0 || nl_link_index(fd, "no-such-link") != -ENODEV)
    return 4;
  if (nl_addr_add(fd, br, ip("10.9.0.1"), 24) != 0 || nl_link_up(fd, br) != 0)
    return 5;
  /* the gateway's listener, before the worker connects */
  ls = socket(AF_INET, SOCK_STREAM, 0);
  at.sin_addr = ip("10.9.0.1");
  if (ls < 0 || bind(ls, (struct sockaddr *)&at, sizeof(at)) != 0 || listen(ls, 4) != 0 ||
      getsockname(ls, (struct sockaddr *)&at, &len) != 0)
    return 6;
  if (pipe(pipefd) != 0)
    return 7;
  w = fork();
  if (w == 0) {
    close(pipefd[1]);
    if (unshare(CLONE_NEWNET) != 0)
      _exit(9);
    _exit(worker_side(pipefd[0], ntohs(at.sin_port)));
  }
  close(pipefd[0]);
  /* The peer goes into the worker's namespace once the worker has made
   * it: /proc then shows its namespace apart from ours. */
  for (int tries = 0;; tries++) {
    int rc;
    char path[64], mine[64], theirs[64];
    ssize_t a, b;

    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)w);
    a = readlink(path, theirs, sizeof(theirs) - 1);
    b = readlink("/proc/self/ns/net", mine, sizeof(mine) - 1);
    if (a > 0 && b > 0 && (a != b || memcmp(theirs, mine, (size_t)a) != 0)) {
      rc = nl_veth_add(fd, "tv0", br, "eth0", w);
      if (rc != 0)
        return 20;
      break;
    }
    if (waitpid(w, &rc, WNOHANG) == w)
      return 30 + (WIFEXITED(rc) ? WEXITSTATUS(rc) : 99); /* the child ended first */
    if (tries > 10000)
      return 21; /* (10 s at least) */
    usleep(1000);
  }
  veth = nl_link_index(fd, "tv0");
  if (veth <= 0 || nl_link_index(fd, "eth0") != -ENODEV)
    return 22; /* the peer is in the worker's namespace, not here */
  if (write(pipefd[1], "x", 1) != 1)
    return 23;
  if (waitpid(w, &status, 0) != w || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return 30 + (WIFEXITED(status) ? WEXITSTATUS(status) : 99);
  if (nl_link_del(fd, veth) != 0 || nl_link_index(fd, "tv0") != -ENODEV)
    return 24;
  close(fd);
  return 0;
}

START_TEST(a_bridge_a_veth_pair_into_another_namespace_and_a_route_carry_tcp) {
  int status;
  pid_t p = fork();

  ck_assert_int_ge(p, 0);
  if (p == 0)
    _exit(bridge_and_veth());
  ck_assert_int_eq(waitpid(p, &status, 0), p);
  ck_assert(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77 && geteuid() != 0)
    return; /* no network namespace without root: nothing to check */
  ck_assert_msg(WEXITSTATUS(status) == 0, "netlink step %d failed", WEXITSTATUS(status));
}
END_TEST

START_TEST(subnets_parse_name_their_bridge_and_map_slots) {
  struct subnet s;
  char err[200], buf[32];

  ck_assert_int_eq(subnet_parse("10.213.0.0/16", &s, err, sizeof(err)), 0);
  subnet_bridge_name(&s, buf, sizeof(buf));
  ck_assert_str_eq(buf, "muster0");
  ck_assert_uint_eq(subnet_gateway(&s), 0x0ad50001u);
  ck_assert_int_eq(subnet_slots(&s, 254 * 254), 254 * 254); /* 65533, capped */
  subnet_slot_ip(&s, 0, buf, sizeof(buf));
  ck_assert_str_eq(buf, "10.213.0.2");
  subnet_slot_ip(&s, 300, buf, sizeof(buf));
  ck_assert_str_eq(buf, "10.213.1.46");
  ck_assert_int_eq(subnet_ip_slot(&s, "10.213.1.46"), 300);
  ck_assert_int_eq(subnet_ip_slot(&s, "10.213.0.1"), -1);     /* the gateway */
  ck_assert_int_eq(subnet_ip_slot(&s, "10.213.255.255"), -1); /* broadcast */
  ck_assert_int_eq(subnet_ip_slot(&s, "10.214.0.2"), -1);
  ck_assert_int_eq(subnet_ip_slot(&s, "127.0.1.1"), -1);
  ck_assert_int_eq(subnet_ip_slot(&s, "10.213.0.2x"), -1);

  ck_assert_int_eq(subnet_parse("10.128.7.0/24", &s, err, sizeof(err)), 0);
  subnet_bridge_name(&s, buf, sizeof(buf));
  ck_assert_str_eq(buf, "mu0a80070018");
  ck_assert_int_eq(subnet_slots(&s, 1000), 253);
  subnet_slot_ip(&s, 252, buf, sizeof(buf));
  ck_assert_str_eq(buf, "10.128.7.254");
  ck_assert_int_eq(subnet_ip_slot(&s, "10.128.7.254"), 252);
  ck_assert_int_eq(subnet_ip_slot(&s, "10.128.7.255"), -1);
  /* two subnets that differ only in their prefix have bridges apart */
  ck_assert_int_eq(subnet_parse("10.128.0.0/16", &s, err, sizeof(err)), 0);
  subnet_bridge_name(&s, buf, sizeof(buf));
  ck_assert_str_eq(buf, "mu0a80000010");

  ck_assert_int_eq(subnet_parse("10.213.0.1/16", &s, err, sizeof(err)), -1);
  ck_assert_ptr_nonnull(strstr(err, "host bits"));
  ck_assert_int_eq(subnet_parse("10.213.0.0/30", &s, err, sizeof(err)), -1);
  ck_assert_int_eq(subnet_parse("10.213.0.0", &s, err, sizeof(err)), -1);
  ck_assert_int_eq(subnet_parse("10.213.0.0/16x", &s, err, sizeof(err)), -1);
  ck_assert_int_eq(subnet_parse("nope/16", &s, err, sizeof(err)), -1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("netlink");
  TCase *tc = tcase_create("netlink");

  tcase_add_test(tc, a_bridge_a_veth_pair_into_another_namespace_and_a_route_carry_tcp);
  tcase_add_test(tc, subnets_parse_name_their_bridge_and_map_slots);
  suite_add_tcase(s, tc);
  return check_run(s);
}
