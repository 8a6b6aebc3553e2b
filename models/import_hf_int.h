/* Internals shared by the Hugging Face importer's files (models/import_hf*.c). */
#ifndef DHP_IMPORT_HF_INT_H
#define DHP_IMPORT_HF_INT_H

#include "models/models.h"

typedef struct {
    const cJSON *obj;
    const cJSON *fallback;   /* second place to look (older configs keep text keys top-level) */
    char ctx[200];
} hf_section;

/* s reads obj, then fallback; ctx "<what>: <name>" prefixes its errors. */
void hf_sec(hf_section *s, const cJSON *obj, const cJSON *fallback, const char *what, const char *name);
const cJSON *hf_lookup(const hf_section *s, const char *key);
/* Integer in [0, MODEL_MAX_WIDTH]; dflt < 0 means required. */
int hf_int(const hf_section *s, const char *key, long dflt, int *out, char *err);
int hf_bool(const hf_section *s, const char *key, bool dflt, bool *out, char *err);
int hf_eps(const hf_section *s, const char *key, double *out, char *err);
const char *hf_str(const hf_section *s, const char *key);
int hf_list(const hf_section *s, const char *key, int *list, int *n, char *err);
/* A derived size (product of config values) that must fit an int. */
int hf_narrow(int64_t v, const hf_section *s, const char *field, int *out, char *err);
const cJSON *hf_sub(const cJSON *root, const char *key);
void hf_init_module(model_module *mm, const char *name, model_kind kind);
/* head_dim from the config, else hidden / heads (which must divide). */
int hf_set_head_dim(model_module *mm, const hf_section *s, char *err);

/* Shared importers (models/import_hf.c). */
int hf_import_text_config(const cJSON *root, const char *key, const char *dflt_type, bool top_fallback,
                          const char *what, model_module *mm, char *err);
int hf_import_qwen_vision(const cJSON *root, const char *what, bool v25, model_module *mm, char *err);
int hf_import_clip_vision(const cJSON *root, const char *what, model_module *mm, char *err);
/* Whisper-style audio encoder from section s (Qwen2-Audio's and Qwen2.5-Omni's). */
int hf_import_whisper(const hf_section *s, bool learned_positions, model_module *mm, char *err);
/* LLaVA: CLIP tower, two-layer projector, text model (text_config, default llama). */
int hf_import_llava(const cJSON *root, const char *what, model_t *m, char *err);
/* Encoder enc feeds the LLM: out_hidden = LLM hidden; proj_hidden >= 0 sets the projector's hidden width. */
void hf_connect(model_t *m, model_module *enc, int proj_hidden);

/* The newer types (models/import_hf_vlm.c); UTIL_ENOTFOUND when type is not one of them. */
int hf_import_vlm(const cJSON *root, const char *type, const char *what, model_t *m, char *err);

#endif
