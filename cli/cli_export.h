/* dhp export's mapping of a plan onto other trainers (cli/export.c). */
#ifndef DHP_CLI_EXPORT_H
#define DHP_CLI_EXPORT_H

#include "cli/cli.h"

typedef enum { CLI_MEGATRON = 0, CLI_DEEPSPEED, CLI_TORCHTITAN } cli_trainer;

/* {"trainer", "model", "placement", ..., "notes": [...]}: megatron adds
 * "args" (the LLM's command-line arguments), "world_size" and
 * "mimo_module_grid_specs"; deepspeed "modules" [{module, first_rank, ranks,
 * data_parallel_size, config}]; torchtitan "toml" {section: {key: value}}. */
int cli_export(const plan_t *p, cli_trainer t, cJSON **out, char *err);

#endif
