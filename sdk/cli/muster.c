/* muster.c: the muster command-line tool's entry: the global options
 * (--url, --token, --help, --version), the usage, and the table of
 * commands that main walks. The commands live in cmd_*.c; like them, this
 * file uses only libmuster's public API (muster.h), as curl's tool uses
 * only libcurl's. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char usage_main[] =
    "usage: muster [--url URL] [--token TOKEN] COMMAND [ARGS]\n"
    "       muster --version | --help\n"
    "\n"
    "Launch, await and stop muster workers.\n"
    "\n"
    "commands:\n"
    "  launch     start workers (idle, or running a script, code or command)\n"
    "  await      wait until workers run (--running) or end (--completion)\n"
    "  ps, ls     list workers\n"
    "  show       show workers in full\n"
    "  stop       stop workers\n"
    "  logs       print (or follow) a worker's output\n"
    "  exec       run a command inside a worker (stdin/stdout relayed; no SSH)\n"
    "  run        launch a cluster, train across it (ps, allreduce, exec), stop it\n"
    "  runs       list runs (muster run's and run_cluster()'s); runs show RUN\n"
    "  metrics    a run's metrics (loss, accuracy...), once or --follow\n"
    "  stack      inside a worker: what its processes do, with their stacks\n"
    "  users      the controller's users (administrators: list, add, token, remove)\n"
    "  whoami     whose token this is, and the account their workers run as\n"
    "  rsh        Open MPI's rsh agent on the exec channel (used by muster run)\n"
    "  rank       start an Open MPI rank inside its own worker (used by muster run)\n"
    "\n"
    "The controller's URL is --url, else MUSTER_URL, else the state directory's\n"
    "(of the local controller: $MUSTER_STATE_DIR, default ~/.muster); its token\n"
    "likewise --token, MUSTER_TOKEN or the state directory's. HOST:PORT is\n"
    "http://HOST:PORT.\n"
    "Run 'muster COMMAND --help' for a command's options.\n"
    "\n"
    "exit codes:\n"
    "  0  all good\n"
    "  1  a worker or the training failed, or the wait timed out\n"
    "  2  usage error (the command line is wrong)\n"
    "  3  not found: no such worker or run\n"
    "  4  refused: an invalid value, a request that can never fit, the wrong\n"
    "     state for it, or a bad token\n"
    "  5  unreachable: no controller found, or it is down or timed out\n"
    "  6  internal: the controller or muster failed inside\n"
    "(muster exec exits with its command's code.)\n";

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
} commands[] = {
    {"launch", cmd_launch},   {"await", cmd_await}, {"ps", cmd_ps},       {"ls", cmd_ps},
    {"show", cmd_show},       {"stop", cmd_stop},   {"logs", cmd_logs},   {"exec", cmd_exec},
    {"rsh", cmd_rsh},         {"rank", cmd_rank},   {"run", cmd_run},     {"runs", cmd_runs},
    {"metrics", cmd_metrics}, {"stack", cmd_stack}, {"users", cmd_users}, {"whoami", cmd_whoami},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

int main(int argc, char **argv) {
  int i = 1;

  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_main, stdout);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("muster %s\n", MUSTER_VERSION);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
      opt_url = argv[++i];
    } else if (strcmp(argv[i], "--token") == 0 && i + 1 < argc) {
      opt_token = argv[++i];
    } else {
      return unknown_option(usage_main, argv[i]);
    }
  }
  if (i >= argc) {
    /* Nothing asked: the whole usage, as the one place it is not noise. */
    fputs(usage_main, stderr);
    return EXIT_USAGE;
  }
  argc -= i;
  argv += i;
  for (size_t k = 0; k < NCOMMANDS; k++)
    if (strcmp(argv[0], commands[k].name) == 0)
      return commands[k].run(argc, argv);
  {
    const char *names[NCOMMANDS], *best;
    for (size_t k = 0; k < NCOMMANDS; k++)
      names[k] = commands[k].name;
    best = closest_word(argv[0], names, NCOMMANDS);
    if (best)
      return usage_error(usage_main, "unknown command \"%s\" (did you mean %s?)", argv[0], best);
  }
  return usage_error(usage_main, "unknown command \"%s\"", argv[0]);
}
