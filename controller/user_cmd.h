/* user_cmd.h: `muster-controller user ...` (user_cmd.c). */
#ifndef MUSTER_USER_CMD_H
#define MUSTER_USER_CMD_H

/* argv[0] is "user"; returns the process's exit code. */
int user_cmd(int argc, char **argv);

#endif
