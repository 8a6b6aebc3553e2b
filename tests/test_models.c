#include "test.h"
#include "test_fixture.h"
#include "models/models.h"

#include <stdlib.h>
#include <unistd.h>

static const char *real_models[] = {
    "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen2.5-vl-32b", "qwen2.5-vl-72b", "llava-1.5-7b", "llava-1.5-13b",
    "internvl2.5-26b", "internvl2.5-78b", "llama-3.2-vision-11b", "llama-3.2-vision-90b", "qwen2-audio-7b",
};
#define N_REAL ((int)(sizeof real_models / sizeof *real_models))

static bool in_zoo(const char *name)
{
    for (int i = 0; i < model_zoo_count(); i++)
        if (strcmp(model_zoo_name(i), name) == 0) return true;
    return false;
}

TEST(models_zoo_lists_every_model)
{
    for (int i = 0; i < N_REAL; i++) CHECK_MSG(in_zoo(real_models[i]), "%s missing from the zoo", real_models[i]);
    CHECK(in_zoo("tiny-vl"));
    CHECK(in_zoo("tiny-vl-window"));
    CHECK(in_zoo("dhp-100m"));
    CHECK(model_zoo_name(model_zoo_count()) == NULL);
}

TEST(models_zoo_every_model_loads_validates_and_round_trips)
{
    char err[UTIL_ERR_LEN];
    for (int i = 0; i < model_zoo_count(); i++) {
        model_t a, b;
        CHECK_MSG(model_load(model_zoo_name(i), &a, err) == UTIL_OK, "%s: %s", model_zoo_name(i), err);
        CHECK_MSG(model_validate(&a, err) == UTIL_OK, "%s: %s", model_zoo_name(i), err);
        CHECK(strcmp(a.name, model_zoo_name(i)) == 0);
        cJSON *j = model_to_json(&a);
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        int rc = model_parse_json(text, "roundtrip", &b, err);
        free(text);
        CHECK_MSG(rc == UTIL_OK, "%s: %s", model_zoo_name(i), err);
        CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "%s: round trip changed the model", model_zoo_name(i));
        CHECK(model_total_params(&a) == model_total_params(&b));
    }
}

TEST(models_param_counts_match_published_totals_within_1pct)
{
    char err[UTIL_ERR_LEN];
    for (int i = 0; i < N_REAL; i++) {
        model_t m;
        CHECK_MSG(model_load(real_models[i], &m, err) == UTIL_OK, "%s", err);
        CHECK_MSG(m.published_params > 0 && m.published_source[0], "%s: no published total", m.name);
        CHECK_MSG(strstr(m.source, "https://huggingface.co/") && strstr(m.source, "config.json"),
                  "%s: source is not a config.json URL", m.name);
        CHECK_NEAR(model_total_params(&m), m.published_params, 0.01);
    }
}

/* model.safetensors.index.json of Qwen2.5-VL-7B-Instruct: total_size
 * 16584333312 bytes in bf16, i.e. exactly 8292166656 parameters. */
TEST(models_qwen25_vl_7b_count_is_exact)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(model_load("qwen2.5-vl-7b", &m, err));
    CHECK_EQ_INT(model_total_params(&m), 8292166656LL);
    int v = model_find_kind(&m, MODEL_VISION);
    CHECK(v >= 0);
    CHECK_EQ_INT(m.mod[v].window, 64);
    CHECK(model_layer_is_full_attention(&m.mod[v], 7));
    CHECK(!model_layer_is_full_attention(&m.mod[v], 8));
}

/* Hand count of one block (elements):
 * vision d=32, f=64, biased: 2 norms 64 + 4 x (32*32+32) + 2 x (32*64+64) + (64*32+32) = 10592.
 * llm d=64, kv 2x16: norms 128 + q 4160 + k 2080 + v 2080 + o 4096 + 3*64*128 = 37120. */
TEST(models_tiny_vl_is_the_executor_contract)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(model_load("tiny-vl", &m, err));
    CHECK_EQ_INT(m.n_modules, 2);
    const model_module *v = &m.mod[model_find(&m, "vision")], *l = &m.mod[model_find(&m, "llm")];
    CHECK_EQ_INT(m.llm, model_find(&m, "llm"));
    CHECK(v->layers == 2 && v->hidden == 32 && v->heads == 4 && v->kv_heads == 4 && v->head_dim == 8);
    CHECK(v->ffn == 64 && v->ffn_kind == MODEL_FFN_SWIGLU && v->norm == MODEL_NORM_RMSNORM);
    CHECK(v->qkv_bias && v->out_bias && v->mlp_bias && v->in_channels == 3 && v->patch == 4);
    CHECK(v->temporal_patch == 1 && v->merge == 2 && v->window == 0 && v->proj_norm);
    CHECK(v->proj_in == 128 && v->proj_hidden == 128 && v->out_hidden == 64 && v->feeds == m.llm);
    CHECK(l->layers == 2 && l->hidden == 64 && l->heads == 4 && l->kv_heads == 2 && l->head_dim == 16);
    CHECK(l->ffn == 128 && l->ffn_kind == MODEL_FFN_SWIGLU && l->norm == MODEL_NORM_RMSNORM);
    CHECK(l->qkv_bias && !l->out_bias && !l->mlp_bias && l->vocab == 272 && !l->tied_embeddings);
    CHECK_EQ_INT(model_layer_params(v, 0), 10592);
    CHECK_EQ_INT(model_layer_params(l, 1), 37120);
    CHECK_EQ_INT(model_blocks_params(l), 2 * 37120);
    CHECK_EQ_INT(model_embed_params(l), 272 * 64);
    CHECK_EQ_INT(model_head_params(l), 64 + 272 * 64);
    /* patch 3*4*4 -> 32 with its bias (patch_bias: the executor's layout follows it; Qwen2.5-VL's
     * Conv3d has none, tiny-vl keeps the one dhp's executor always gave it); head: ln_q 32 +
     * Linear(128,128) + Linear(128,64) */
    CHECK(v->patch_bias);
    CHECK_EQ_INT(model_embed_params(v), 48 * 32 + 32);
    CHECK_EQ_INT(model_head_params(v), 32 + 128 * 128 + 128 + 128 * 64 + 64);
    CHECK_EQ_INT(model_largest_layer_params(l), 37120);
    for (int i = 0; i < 2; i++) CHECK(model_layer_is_full_attention(v, i));
}

TEST(models_tiny_vl_window_and_dhp_100m)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(model_load("tiny-vl-window", &m, err));
    const model_module *v = &m.mod[model_find_kind(&m, MODEL_VISION)];
    CHECK(v->layers == 4 && v->window == 16 && v->n_full_layers == 2);
    CHECK(!model_layer_is_full_attention(v, 0) && model_layer_is_full_attention(v, 1));
    CHECK(!model_layer_is_full_attention(v, 2) && model_layer_is_full_attention(v, 3));
    CHECK_OK(model_load("dhp-100m", &m, err));
    int64_t total = model_total_params(&m);
    CHECK_MSG(total > 90000000 && total < 120000000, "dhp-100m has %lld params", (long long)total);
    CHECK_EQ_INT(m.mod[m.llm].head_dim, 64);
    CHECK_EQ_INT(m.mod[m.llm].kv_heads, 4);
}

/* Mllama cross block = self block + q_norm, k_norm (head_dim each) + 2 gates;
 * the last 8 vision blocks carry 2 gates each. */
TEST(models_llama_vision_cross_and_gated_layers)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(model_load("llama-3.2-vision-11b", &m, err));
    const model_module *l = &m.mod[m.llm], *v = &m.mod[model_find_kind(&m, MODEL_VISION)];
    CHECK_EQ_INT(l->n_cross_layers, 8);
    CHECK(model_layer_is_cross(l, 3) && !model_layer_is_cross(l, 4));
    CHECK_EQ_INT(model_layer_params(l, 3) - model_layer_params(l, 0), 2 * 128 + 2);
    CHECK_EQ_INT(model_layer_params(v, 39) - model_layer_params(v, 0), 2);
    CHECK_EQ_INT(model_largest_layer_params(l), model_layer_params(l, 3));
}

TEST(models_find_and_names)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(model_load("qwen2-audio-7b", &m, err));
    CHECK_EQ_INT(model_find(&m, "audio"), 0);
    CHECK_EQ_INT(model_find(&m, "vision"), -1);
    CHECK_EQ_INT(model_find_kind(&m, MODEL_AUDIO), 0);
    CHECK_EQ_INT(model_find_kind(&m, MODEL_VISION), -1);
    CHECK(strcmp(model_kind_name(MODEL_AUDIO), "audio") == 0);
    CHECK(strcmp(model_kind_name(MODEL_LLM), "llm") == 0);
    CHECK(!m.mod[0].k_bias && m.mod[0].qkv_bias);
}

/* ---- bad input ---- */

static const char *base_json =
    "{\"schema\": \"dhp.model/1\", \"name\": \"t\", \"modules\": [\n"
    " {\"name\": \"vision\", \"kind\": \"vision\", \"layers\": 4, \"hidden\": 32, \"heads\": 4, \"ffn\": 64,\n"
    "  \"patch\": 4, \"merge\": 2, \"window\": 16, \"full_layers\": [1, 3], \"out_hidden\": 64, \"feeds\": \"llm\"},\n"
    " {\"name\": \"llm\", \"kind\": \"llm\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, \"kv_heads\": 2,\n"
    "  \"ffn\": 128, \"vocab\": 272}]}";

/* base_json with the first occurrence of `from` replaced by `to`. */
static char *variant(const char *from, const char *to)
{
    const char *at = strstr(base_json, from);
    if (!at) return NULL;
    size_t n = strlen(base_json) + strlen(to) + 1;
    char *s = malloc(n);
    if (!s) return NULL;
    snprintf(s, n, "%.*s%s%s", (int)(at - base_json), base_json, to, at + strlen(from));
    return s;
}

static int parse_variant(const char *from, const char *to, char *err)
{
    char *s = variant(from, to);
    if (!s) return -1;
    model_t m;
    int rc = model_parse_json(s, "x.json", &m, err);
    free(s);
    return rc;
}

#define CHECK_BAD(from, to, want) do { char _err[UTIL_ERR_LEN] = ""; \
    int _rc = parse_variant(from, to, _err); \
    CHECK_MSG(_rc == UTIL_EINVAL, "%s -> %s: rc %d (%s)", from, to, _rc, _err); \
    CHECK_MSG(strstr(_err, want) != NULL, "error '%s' lacks '%s'", _err, want); \
    CHECK_MSG(strncmp(_err, "x.json", 6) == 0, "error '%s' does not name the file", _err); } while (0)

TEST(models_base_fixture_is_valid)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_MSG(model_parse_json(base_json, "x.json", &m, err) == UTIL_OK, "%s", err);
    CHECK_EQ_INT(m.mod[0].head_dim, 8);
    CHECK_EQ_INT(m.mod[0].proj_in, 128);
    CHECK_EQ_INT(m.mod[0].kv_heads, 4);
    CHECK(m.mod[1].final_norm && !m.mod[0].final_norm);
}

TEST(models_rejects_malformed_json_with_line_and_column)
{
    CHECK_BAD("\"ffn\": 128", "\"ffn\" 128", "line 5");
    CHECK_BAD("\"ffn\": 128", "\"ffn\" 128", "column");
}

TEST(models_rejects_missing_and_bad_sizes)
{
    CHECK_BAD("\"ffn\": 128, ", "", "modules[1].ffn: required field is missing");
    CHECK_BAD("\"hidden\": 32", "\"hidden\": 0", "modules[0].hidden: must be > 0");
    CHECK_BAD("\"layers\": 2", "\"layers\": -2", "modules[1].layers: must be > 0 (got -2)");
    CHECK_BAD("\"vocab\": 272", "\"vocab\": 0", "modules[1].vocab");
    CHECK_BAD("\"ffn\": 128", "\"ffn\": 12.5", "modules[1].ffn: must be an integer");
    CHECK_BAD("\"patch\": 4, ", "", "modules[0].patch: required");
}

TEST(models_rejects_head_mismatches)
{
    CHECK_BAD("\"heads\": 4, \"kv_heads\"", "\"heads\": 7, \"kv_heads\"", "modules[1].heads: 7 does not divide hidden 64");
    CHECK_BAD("\"kv_heads\": 2", "\"kv_heads\": 3", "modules[1].kv_heads: 3 does not divide heads 4");
    CHECK_BAD("\"kv_heads\": 2", "\"kv_heads\": 0", "modules[1].kv_heads: must be > 0");
    char err[UTIL_ERR_LEN];
    /* an explicit head_dim lifts the divisibility rule (heads*head_dim != hidden is allowed) */
    CHECK(parse_variant("\"heads\": 4, \"kv_heads\": 2", "\"heads\": 6, \"kv_heads\": 2, \"head_dim\": 16", err) == 0);
}

TEST(models_rejects_bad_kinds_and_graph)
{
    CHECK_BAD("\"kind\": \"vision\"", "\"kind\": \"video\"", "modules[0].kind: unknown value 'video'");
    CHECK_BAD("\"ffn\": 64,", "\"ffn\": 64, \"ffn_kind\": \"relu\",", "modules[0].ffn_kind");
    CHECK_BAD("\"out_hidden\": 64", "\"out_hidden\": 48", "modules[0].out_hidden: 48 differs from llm hidden 64");
    CHECK_BAD("\"feeds\": \"llm\"", "\"feeds\": \"decoder\"", "modules[0].feeds: no module named 'decoder'");
    CHECK_BAD("\"feeds\": \"llm\"", "\"feeds\": \"vision\"", "modules[0].feeds: must name the llm");
    CHECK_BAD("\"ffn\": 64,", "\"ffn\": 64, \"cross_layers\": [1],", "modules[0].cross_layers: not a field of a vision");
    CHECK_BAD("\"ffn\": 64,", "\"ffn\": 64, \"hedas\": 4,", "modules[0].hedas: unknown field");
    CHECK_BAD("dhp.model/1", "dhp.model/2", "schema");
    CHECK_BAD("\"name\": \"t\", ", "", "x.json: name: required field is missing");
    CHECK_BAD(",\n {\"name\": \"llm\"", ",\n {\"name\": \"llm2\", \"kind\": \"llm\", \"layers\": 1, \"hidden\": 64, "
              "\"heads\": 4, \"ffn\": 8, \"vocab\": 9},\n {\"name\": \"llm\"", "second llm");
    CHECK_BAD("\"kind\": \"llm\"", "\"kind\": \"audio\"", "modules[1].vocab: not a field of an audio");
}

TEST(models_rejects_bad_layer_lists)
{
    CHECK_BAD("[1, 3]", "[1, 4]", "modules[0].full_layers[1]: layer 4 is out of range [0, 4)");
    CHECK_BAD("[1, 3]", "[3, 1]", "modules[0].full_layers[1]: 1 is not after 3");
    CHECK_BAD("[1, 3]", "[-1]", "out of range");
    CHECK_BAD("\"window\": 16", "\"window\": 0", "modules[0].full_layers: given but window is 0");
    CHECK_BAD("\"vocab\": 272", "\"vocab\": 272, \"cross_layers\": [2]", "modules[1].cross_layers[0]: layer 2 is out of range");
    CHECK_BAD("\"vocab\": 272", "\"vocab\": 272, \"cross_layers\": [0, 1]", "none self-attention");
}

TEST(models_validate_checks_edited_structs)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(model_load("qwen2.5-vl-32b", &m, err));
    CHECK_OK(model_validate(&m, err));
    model_t bad = m;
    bad.mod[bad.llm].kv_heads = 7;
    CHECK(model_validate(&bad, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "qwen2.5-vl-32b: modules[1].kv_heads: 7 does not divide heads 40"), "%s", err);
    bad = m;
    bad.mod[0].out_hidden = 4096;
    CHECK(model_validate(&bad, err) == UTIL_EINVAL);
    CHECK(strstr(err, "modules[0].out_hidden") != NULL);
    bad = m;
    bad.mod[0].kind = MODEL_LLM;
    CHECK(model_validate(&bad, err) == UTIL_EINVAL);
    CHECK(strstr(err, "2 llm modules") != NULL);
    bad = m;
    bad.mod[0].full_layers[0] = 32;
    CHECK(model_validate(&bad, err) == UTIL_EINVAL);
    CHECK(strstr(err, "full_layers[0]") != NULL);
}

TEST(models_load_unknown_name_and_files)
{
    char err[UTIL_ERR_LEN] = "";
    model_t m;
    CHECK(model_load("qwen9-vl-1t", &m, err) == UTIL_ENOTFOUND);
    CHECK(strstr(err, "qwen9-vl-1t") != NULL && strstr(err, "tiny-vl") != NULL);
    CHECK(model_load("/nonexistent-dhp/x.json", &m, err) == UTIL_EIO);
    CHECK(strstr(err, "/nonexistent-dhp/x.json") != NULL);
    char path[] = "/tmp/dhp-models-XXXXXX.json";
    int fd = mkstemps(path, 5);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(util_write_atomic(path, base_json, strlen(base_json), err));
    CHECK_MSG(model_load(path, &m, err) == UTIL_OK, "%s", err);
    CHECK_EQ_INT(m.mod[0].layers, 4);
    char *bad = variant("\"hidden\": 32", "\"hidden\": -1");
    CHECK_OK(util_write_atomic(path, bad, strlen(bad), err));
    free(bad);
    CHECK(model_load(path, &m, err) == UTIL_EINVAL);
    CHECK_MSG(strncmp(err, path, strlen(path)) == 0 && strstr(err, "modules[0].hidden"), "%s", err);
    unlink(path);
}

/* ---- Hugging Face importer ---- */

TEST(models_import_hf_matches_zoo_counts)
{
    static const char *pairs[][2] = {
        {"qwen2.5-vl-7b.json", "qwen2.5-vl-7b"}, {"qwen2.5-vl-3b.json", "qwen2.5-vl-3b"},
        {"llava-1.5-7b.json", "llava-1.5-7b"}, {"llava-1.5-13b.json", "llava-1.5-13b"},
        {"internvl2.5-26b.json", "internvl2.5-26b"}, {"llama-3.2-vision-11b.json", "llama-3.2-vision-11b"},
        {"qwen2-audio-7b.json", "qwen2-audio-7b"}, {"internvl2.5-78b.json", "internvl2.5-78b"},
        {"llama-3.2-vision-90b.json", "llama-3.2-vision-90b"},
    };
    char err[UTIL_ERR_LEN];
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        model_t imp, zoo;
        CHECK_MSG(test_import_hf(pairs[i][0], &imp, err) == UTIL_OK, "%s: %s", pairs[i][0], err);
        CHECK_OK(model_load(pairs[i][1], &zoo, err));
        CHECK_EQ_INT(imp.n_modules, zoo.n_modules);
        for (int k = 0; k < zoo.n_modules; k++)
            CHECK_MSG(model_module_params(&imp.mod[k]) == model_module_params(&zoo.mod[k]),
                      "%s module %s: imported %lld, zoo %lld", pairs[i][0], zoo.mod[k].name,
                      (long long)model_module_params(&imp.mod[k]), (long long)model_module_params(&zoo.mod[k]));
        CHECK(strcmp(imp.name, pairs[i][1]) == 0);
        for (int k = 0; k < zoo.n_modules; k++)   /* field for field, not only the count */
            CHECK_MSG(memcmp(&imp.mod[k], &zoo.mod[k], sizeof zoo.mod[k]) == 0, "%s: module %s differs from the zoo",
                      pairs[i][0], zoo.mod[k].name);
        model_t back;
        CHECK_MSG(test_model_json_round_trip(&imp, &back, err) == UTIL_OK, "%s: %s", pairs[i][0], err);
        CHECK(memcmp(&back, &imp, sizeof imp) == 0);
    }
}

/* Published totals (Hugging Face model pages): Qwen2-VL-7B-Instruct 8.29B,
 * Llama-3.1-8B 8.03B; see tests/data/hf/README.md. */
TEST(models_import_hf_other_types)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_MSG(test_import_hf("qwen2-vl-7b.json", &m, err) == UTIL_OK, "%s", err);
    CHECK_NEAR(model_total_params(&m), 8.29e9, 0.01);
    CHECK(m.mod[0].norm == MODEL_NORM_LAYERNORM && m.mod[0].window == 0 && m.mod[0].ffn == 5120);
    CHECK_MSG(test_import_hf("llama-3.1-8b.json", &m, err) == UTIL_OK, "%s", err);
    CHECK_EQ_INT(m.n_modules, 1);
    CHECK_NEAR(model_total_params(&m), 8.03e9, 0.01);
    CHECK_EQ_INT(m.mod[0].kv_heads, 8);
}

TEST(models_import_hf_refuses_bad_input)
{
    char err[UTIL_ERR_LEN] = "";
    model_t m;
    CHECK(model_import_hf("{\"model_type\": \"gpt2\"}", "c.json", &m, err) == UTIL_EUNSUPPORTED);
    CHECK(strstr(err, "c.json") && strstr(err, "'gpt2'"));
    CHECK(model_import_hf("{\"model_type\": ", "c.json", &m, err) == UTIL_EINVAL);
    CHECK(strstr(err, "line 1") != NULL);
    CHECK(model_import_hf("{\"vocab_size\": 3}", "c.json", &m, err) == UTIL_EINVAL);
    CHECK(strstr(err, "model_type") != NULL);
    CHECK(model_import_hf("{\"model_type\": \"internvl_chat\", \"vision_config\": {\"hidden_size\": 3200}}",
                          "c.json", &m, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "vision_config.intermediate_size: required") != NULL, "%s", err);
    CHECK(model_import_hf("{\"model_type\": \"llama\", \"num_attention_heads\": 7}", "c.json", &m, err) ==
          UTIL_EINVAL);
    CHECK_MSG(strstr(err, "head_dim") != NULL, "%s", err);
}

TEST(models_rejects_sizes_beyond_limits)
{
    CHECK_BAD("\"vocab\": 272", "\"vocab\": 2000000000", "modules[1].vocab: 2000000000 exceeds the limit");
    CHECK_BAD("\"merge\": 2", "\"merge\": 2000000", "modules[0].proj_in");
    CHECK_BAD("\"patch\": 4", "\"patch\": 5000", "modules[0].patch: 5000 exceeds the limit 1024");
    CHECK_BAD("\"layers\": 2", "\"layers\": 1000000", "modules[1].layers: 1000000 exceeds");
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK(model_import_hf("{\"model_type\": \"qwen2\", \"hidden_size\": 3000000000}", "c.json", &m, err) ==
          UTIL_EINVAL);
    CHECK(strstr(err, "config.hidden_size") != NULL);
}

/* Every numeric field of every module set to an extreme value: the loader
 * either accepts it or names a field; counting an accepted model never
 * overflows (checked by the UBSan build). */
TEST(models_extreme_values_never_crash)
{
    static const double extremes[] = {0, -1, 3, 1048576, 2147483647.0};
    const char *names[] = {"tiny-vl-window", "llama-3.2-vision-11b", "qwen2-audio-7b"};
    char err[UTIL_ERR_LEN];
    for (int z = 0; z < 3; z++) {
        model_t m;
        CHECK_OK(model_load(names[z], &m, err));
        cJSON *root = model_to_json(&m);
        cJSON *mods = cJSON_GetObjectItemCaseSensitive(root, "modules");
        cJSON *mod;
        cJSON_ArrayForEach(mod, mods) {
            cJSON *f;
            cJSON_ArrayForEach(f, mod) {
                if (!cJSON_IsNumber(f)) continue;
                double keep = f->valuedouble;
                for (size_t e = 0; e < sizeof extremes / sizeof *extremes; e++) {
                    cJSON_SetNumberValue(f, extremes[e]);
                    model_t t;
                    int rc = model_from_json(root, "x.json", &t, err);
                    CHECK_MSG(rc == UTIL_OK || (rc == UTIL_EINVAL && strstr(err, "x.json")),
                              "%s.%s = %g: rc %d", names[z], f->string, extremes[e], rc);
                    if (rc == UTIL_OK) CHECK(model_total_params(&t) > 0);
                }
                cJSON_SetNumberValue(f, keep);
            }
        }
        cJSON_Delete(root);
    }
}

/* Special token ids: kept through a file, each below the vocabulary's rows. */
TEST(models_tokens_round_trip_and_bad_ids)
{
    char err[UTIL_ERR_LEN];
    char *s = variant("\"name\": \"t\",", "\"name\": \"t\", \"tokens\": {\"image\": 259, \"audio\": 263},");
    model_t m, back;
    CHECK_OK(model_parse_json(s, "x.json", &m, err));
    free(s);
    CHECK_EQ_INT(m.tokens[MODEL_TOK_IMAGE], 259);
    CHECK_EQ_INT(m.tokens[MODEL_TOK_AUDIO], 263);
    CHECK_EQ_INT(m.tokens[MODEL_TOK_VIDEO], -1);
    cJSON *j = model_to_json(&m);
    CHECK_OK(model_from_json(j, "y.json", &back, err));
    cJSON_Delete(j);
    for (int t = 0; t < MODEL_NTOKENS; t++) CHECK_EQ_INT(back.tokens[t], m.tokens[t]);
    CHECK_MSG(strcmp(model_token_name(MODEL_TOK_VISION_START), "vision_start") == 0, "%s", model_token_name(MODEL_TOK_VISION_START));
    CHECK_BAD("\"name\": \"t\",", "\"name\": \"t\", \"tokens\": {\"image\": 272},", "tokens.image: 272 is outside the llm's 272 embedding rows");
    CHECK_BAD("\"name\": \"t\",", "\"name\": \"t\", \"tokens\": {\"picture\": 1},", "tokens.picture: unknown token");
    CHECK_BAD("\"name\": \"t\",", "\"name\": \"t\", \"tokens\": {\"image\": -1},", "tokens.image: must be a non-negative integer");
    CHECK_BAD("\"name\": \"t\",", "\"name\": \"t\", \"tokens\": [1],", "tokens: must be an object");
}

/* An imported config's special tokens, and the model's name from its directory. */
TEST(models_import_hf_keeps_tokens_and_names_by_directory)
{
    char err[UTIL_ERR_LEN];
    const char *cfg = "{\"model_type\": \"qwen2\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 128,"
                      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                      " \"image_token_id\": 290, \"audio_token_index\": 291}";
    model_t m;
    CHECK_OK(model_import_hf(cfg, "/models/My-Model-7B/config.json", &m, err));
    CHECK_MSG(strcmp(m.name, "My-Model-7B") == 0, "name %s", m.name);
    CHECK_EQ_INT(m.tokens[MODEL_TOK_IMAGE], 290);
    CHECK_EQ_INT(m.tokens[MODEL_TOK_AUDIO], 291);
    CHECK_EQ_INT(m.tokens[MODEL_TOK_VISION_END], -1);
    CHECK_OK(model_import_hf(cfg, "config.json", &m, err));
    CHECK_MSG(strcmp(m.name, "qwen2") == 0, "name %s", m.name);
    CHECK_OK(model_import_hf(cfg, "https://example.org/resolve/main/config.json", &m, err));
    CHECK_MSG(strcmp(m.name, "qwen2") == 0, "name %s", m.name);
    CHECK_OK(model_import_hf(cfg, "/x/llama-3.json", &m, err));
    CHECK_MSG(strcmp(m.name, "llama-3") == 0, "name %s", m.name);
    const char *bad = "{\"model_type\": \"qwen2\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 128,"
                      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"image_token_id\": \"x\"}";
    CHECK_EQ_INT(model_import_hf(bad, "c.json", &m, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "image_token_id: must be a non-negative integer") != NULL, "%s", err);
}

/* The norms' epsilon: the file's, else the norm kind's default; an imported
 * config's rms_norm_eps / layer_norm_eps. */
TEST(models_norm_eps_default_round_trip_and_import)
{
    char err[UTIL_ERR_LEN];
    model_t m, back;
    CHECK_OK(model_parse_json(base_json, "x.json", &m, err));
    CHECK(fabs(model_norm_eps(&m.mod[0]) - 1e-5) < 1e-12);   /* the vision LayerNorm's default */
    CHECK(fabs(model_norm_eps(&m.mod[1]) - 1e-6) < 1e-12);   /* the LLM RMSNorm's default */
    char *s = variant("\"vocab\": 272", "\"vocab\": 272, \"norm_eps\": 1e-05");
    CHECK_OK(model_parse_json(s, "x.json", &m, err));
    free(s);
    CHECK(fabs(model_norm_eps(&m.mod[1]) - 1e-5) < 1e-12);
    cJSON *j = model_to_json(&m);
    CHECK_OK(model_from_json(j, "y.json", &back, err));
    cJSON_Delete(j);
    CHECK(back.mod[1].norm_eps == m.mod[1].norm_eps && back.mod[0].norm_eps == 0);
    CHECK_BAD("\"vocab\": 272", "\"vocab\": 272, \"norm_eps\": 0.5", "modules[1].norm_eps");
    CHECK_BAD("\"vocab\": 272", "\"vocab\": 272, \"norm_eps\": -1e-6", "modules[1].norm_eps");
    const char *cfg = "{\"model_type\": \"llama\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 128,"
                      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"rms_norm_eps\": 1e-05}";
    CHECK_OK(model_import_hf(cfg, "c.json", &m, err));
    CHECK(fabs(model_norm_eps(&m.mod[0]) - 1e-5) < 1e-12);
    const char *bad = "{\"model_type\": \"llama\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 128,"
                      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"rms_norm_eps\": 0}";
    CHECK_EQ_INT(model_import_hf(bad, "c.json", &m, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "rms_norm_eps: must be a number in (0, 0.01]") != NULL, "%s", err);
}
