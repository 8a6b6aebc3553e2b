/* The Hugging Face importer's newer types (models/import_hf_vlm.c): each
 * fixture's parameter count against the published total (sources in
 * tests/data/hf/README.md), the layout details that decide it, and bad input. */
#include "tests/test.h"
#include "tests/test_fixture.h"

#include <stdlib.h>
#include "models/models.h"

/* Totals on the models' Hugging Face pages (safetensors parameter count). */
TEST(import_vlm_published_totals)
{
    static const struct { const char *file; double published; int modules; } cases[] = {
        {"llava-v1.6-mistral-7b.json", 7.57e9, 2},
        {"smolvlm-instruct.json", 2.25e9, 2},
        {"paligemma-3b-pt-224.json", 2.92e9, 2},
        {"gemma-3-4b-it.json", 4.30e9, 2},
    };
    char err[UTIL_ERR_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        model_t m;
        CHECK_MSG(test_import_hf(cases[i].file, &m, err) == UTIL_OK, "%s: %s", cases[i].file, err);
        CHECK_EQ_INT(m.n_modules, cases[i].modules);
        CHECK_NEAR(model_total_params(&m), cases[i].published, 0.01);
        model_t back;   /* through our schema and back, unchanged */
        CHECK_MSG(test_model_json_round_trip(&m, &back, err) == UTIL_OK, "%s: %s", cases[i].file, err);
        CHECK(memcmp(&back, &m, sizeof m) == 0);
    }
}

/* Qwen2.5-Omni-7B's published 10.7B includes the Talker and Token2Wav, which
 * dhp leaves out; the Thinker's parts are checked one by one: its text model is
 * Qwen2.5-7B (7.61B on its model card), its vision tower is Qwen2.5-VL-7B's,
 * its audio tower Qwen2-Audio's Whisper encoder without the learned positions
 * (a sinusoidal buffer here) and with the 3584-wide projection. */
TEST(import_vlm_qwen2_5_omni_thinker)
{
    char err[UTIL_ERR_LEN];
    model_t omni, vl, audio;
    CHECK_MSG(test_import_hf("qwen2.5-omni-7b.json", &omni, err) == UTIL_OK, "%s", err);
    CHECK_EQ_INT(omni.n_modules, 3);
    CHECK(omni.mod[0].kind == MODEL_VISION && omni.mod[1].kind == MODEL_AUDIO && omni.mod[2].kind == MODEL_LLM);
    CHECK_NEAR(model_module_params(&omni.mod[2]), 7.61e9, 0.01);
    CHECK_OK(test_import_hf("qwen2.5-vl-7b.json", &vl, err));
    CHECK_EQ_INT(model_module_params(&omni.mod[0]), model_module_params(&vl.mod[0]));
    CHECK_OK(test_import_hf("qwen2-audio-7b.json", &audio, err));
    const model_module *a = &omni.mod[1], *q = &audio.mod[0];
    CHECK_EQ_INT(model_blocks_params(a), model_blocks_params(q));
    int64_t d = a->hidden;
    CHECK_EQ_INT(model_embed_params(a), model_embed_params(q) - (int64_t)q->max_positions * d);
    /* ln_post, proj, audio_bos_eos_token */
    CHECK_EQ_INT(model_head_params(a), model_norm_params(MODEL_NORM_LAYERNORM, d) +
                                       model_linear_params(d, 3584, true) + 2 * 3584);
    CHECK_EQ_INT(a->pool, 2);
}

/* Layout details behind the counts. */
TEST(import_vlm_layouts)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    CHECK_OK(test_import_hf("gemma-3-4b-it.json", &m, err));
    const model_module *v = &m.mod[0], *t = &m.mod[1];
    CHECK_EQ_INT(v->max_positions, 64 * 64);   /* 896 px / 14 */
    CHECK_EQ_INT(v->pool, 16);                 /* 64x64 -> mm_tokens_per_image 256 */
    CHECK(v->proj_norm && v->proj_norm_kind == MODEL_NORM_RMSNORM && !v->proj_bias && v->proj_hidden == 0);
    CHECK(t->qk_norm_head && t->post_norms && t->tied_embeddings);
    CHECK_EQ_INT(t->heads, 8);                 /* Gemma3TextConfig defaults the published config leaves out */
    CHECK_EQ_INT(t->kv_heads, 4);
    CHECK_EQ_INT(t->head_dim, 256);
    CHECK_EQ_INT(t->vocab, 262208);
    CHECK_OK(test_import_hf("smolvlm-instruct.json", &m, err));
    CHECK_EQ_INT(m.mod[0].max_positions, 27 * 27);   /* 384 // 14 */
    CHECK_EQ_INT(m.mod[0].merge, 3);
    CHECK_EQ_INT(m.mod[0].proj_in, 1152 * 9);
    CHECK(!m.mod[1].tied_embeddings);
    CHECK_OK(test_import_hf("paligemma-3b-pt-224.json", &m, err));
    CHECK_EQ_INT(m.mod[0].max_positions, 256);       /* SiglipVisionConfig image_size default 224 */
    CHECK_EQ_INT(m.mod[0].extra_params, 0);          /* vision_use_head false */
    CHECK_EQ_INT(m.mod[1].kv_heads, 1);
    CHECK(m.mod[1].tied_embeddings);
    CHECK_OK(test_import_hf("llava-v1.6-mistral-7b.json", &m, err));
    CHECK_EQ_INT(m.mod[0].extra_params, 4096);       /* image_newline */
    CHECK(!m.mod[0].frozen);
    CHECK_EQ_INT(m.mod[1].vocab, 32064);
}

TEST(import_vlm_refuses_bad_input)
{
    char err[UTIL_ERR_LEN] = "";
    model_t m;
    CHECK(model_import_hf("{\"model_type\": \"blip_2\"}", "c.json", &m, err) == UTIL_EUNSUPPORTED);
    CHECK_MSG(strstr(err, "c.json: model_type: 'blip_2' is not supported") && strstr(err, "gemma3") &&
              strstr(err, "idefics3") && !strchr(err, '\n'), "%s", err);
    CHECK(model_import_hf("{\"model_type\": \"qwen2_5_omni\"}", "c.json", &m, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "thinker_config") != NULL, "%s", err);
    CHECK(model_import_hf("{\"model_type\": \"gemma3\", \"mm_tokens_per_image\": 200, \"vision_config\": {}}",
                          "c.json", &m, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "mm_tokens_per_image") != NULL, "%s", err);
    CHECK(model_import_hf("{\"model_type\": \"paligemma\", \"vision_config\": {\"projection_dim\": 100}, "
                          "\"text_config\": {\"model_type\": \"gemma\"}}", "c.json", &m, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "projection_dim: 100 differs") != NULL, "%s", err);
    CHECK(model_import_hf("{\"model_type\": \"idefics3\", \"scale_factor\": 5, \"vision_config\": {}}", "c.json",
                          &m, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "scale_factor") != NULL, "%s", err);
    CHECK(model_import_hf("{\"model_type\": \"gemma3\", \"vision_config\": {\"patch_size\": 0}}", "c.json", &m,
                          err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "vision_config") != NULL, "%s", err);
}

/* hf:ORG/NAME references: the name rules keep the cache path inside the cache. */
TEST(import_vlm_hub_refs)
{
    char err[UTIL_ERR_LEN];
    model_hub_ref r;
    CHECK_OK(model_hub_parse_ref("hf:Qwen/Qwen2.5-VL-7B-Instruct", &r, err));
    CHECK(!strcmp(r.org, "Qwen") && !strcmp(r.name, "Qwen2.5-VL-7B-Instruct") && !strcmp(r.revision, "main"));
    CHECK_OK(model_hub_parse_ref("hf:google/gemma-3-4b-it@v1.0", &r, err));
    CHECK(!strcmp(r.revision, "v1.0"));
    const char *bad[] = {"hf:Qwen", "hf:../x", "hf:a/..", "hf:a/b/c", "hf:a/b@", "hf:a/.b", "hf:a/b c", "hf:/b",
                         "hf:a/b@../../etc"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(model_hub_parse_ref(bad[i], &r, err) == UTIL_EINVAL, "%s accepted", bad[i]);
    setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
    char url[512];
    CHECK_OK(model_hub_parse_ref("hf:o/n", &r, err));
    CHECK_OK(model_hub_url(&r, url, sizeof url, err));
    CHECK_MSG(!strcmp(url, "http://127.0.0.1:9/o/n/resolve/main/config.json"), "%s", url);
    unsetenv("HF_ENDPOINT");
}
