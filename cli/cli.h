/* cli: the dhp binary's subcommands. Each returns the process exit code:
 * 0 success, 1 a run that failed at run time (e.g. OOM verdict with --check),
 * 2 bad input (one clear line on stderr). */
#ifndef DHP_CLI_H
#define DHP_CLI_H

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);   /* argv[0] is the subcommand name */
    const char *summary;
} cli_command;

/* Prints "dhp: <msg>" on stderr and returns 2. */
int cli_bad_input(const char *msg);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
