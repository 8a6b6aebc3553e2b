/* The hand-off under window attention: an image's merged tokens leave the
 * vision encoder in window order and must reach the LLM in raster order
 * (models/geometry.c; Qwen2.5-VL's reverse_indices). Every stored row of
 * every encoder rank, followed through the planner's segments (their block
 * order included), must land on the LLM rank and row that hold its raster
 * position; and the geometry itself is checked against a direct
 * construction. */
#include "tests/test.h"
#include "planner/planner_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Windows of 2 x 2 merge groups, merge 2: on a 8 x 8 grid, 4 windows. */
TEST(geometry_merged_raster_of_windows)
{
    model_module mm = { .kind = MODEL_VISION, .merge = 2, .window = 16 };
    snprintf(mm.name, sizeof mm.name, "vision");
    char err[UTIL_ERR_LEN];
    int raster[16], rows[64], cols[64];
    CHECK_OK(model_merged_raster(&mm, 8, 8, raster, err));
    const int want[16] = { 0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15 };
    for (int j = 0; j < 16; j++) CHECK_EQ_INT(raster[j], want[j]);
    /* The same order as the stored patches' merge groups. */
    CHECK_OK(model_patch_order(&mm, 8, 8, rows, cols, err));
    for (int j = 0; j < 16; j++) CHECK_EQ_INT(raster[j], rows[4 * j] / 2 * 4 + cols[4 * j] / 2);
    CHECK_EQ_INT(model_window_band_rows(&mm, 8), 8);
    CHECK(!model_merged_order_is_raster(&mm, 8));
    CHECK(model_merged_order_is_raster(&mm, 4));   /* one window across: raster already */
    mm.window = 0;
    CHECK(model_merged_order_is_raster(&mm, 8));
    mm.window = 9;   /* side 3: not a multiple of merge 2 */
    CHECK_EQ_INT(model_merged_raster(&mm, 6, 6, raster, err), UTIL_EINVAL);
}

/* tiny-vl-window on 8xh100; ring: one kv head, so the LLM's sp = 2 runs ring attention (plan_cp_of). */
static int make_window_plan(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, int images,
                            int image_tokens, bool ring, plan_t *p)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (model_load("tiny-vl-window", &m, err) || cost_cluster_load("8xh100", &c, err)) return UTIL_EINVAL;
    if (ring) m.mod[m.llm].kv_heads = 1;
    plan_workload w = { .global_batch = batch, .images_per_sample = images, .image_tokens = image_tokens, .text_tokens = 16 };
    int rc = plan_from_strategy(spec, &m, &c, &w, pl, gpus, n_micro, p, err);
    if (rc) fprintf(stderr, "make_window_plan %s: %s\n", spec, err);
    return rc;
}

/* Where stored row x of the step's row g (sample g / R) must land: LLM
 * sp rank and its buffer row, for LLM dp rank d holding samples from f. */
static void expected_place(const plan_t *p, const int *raster, int per_image, long g, int f, int *sp_rank, int *row)
{
    int L = p->model.llm, R = plan_rows_per_sample(p, 0), E = plan_encoder_offset(p, p->n_modules);
    int i = (int)(g / R), x = (int)(g % R), im = x / per_image;
    int pos = plan_encoder_offset(p, 0) + im * per_image + raster[x % per_image];
    plan_seq q;
    plan_module_seq(&p->model, L, &p->work, &q);
    plan_cp cp = plan_cp_of(&p->model.mod[L], &p->mod[L]);
    for (int j = 0; j < p->mod[L].sp; j++) {
        plan_cp_span span = plan_cp_span_of(cp, (int)q.seq, p->mod[L].sp, j);
        int local = plan_cp_local(&span, pos);
        if (local < 0) continue;
        *sp_rank = j;
        *row = (i - f) * plan_cp_held(&span, 0, E) + local;
        return;
    }
    *sp_rank = *row = -1;
}

/* Follows every segment of every chunk: stored row (enc rank, enc_off + j)
 * -> (LLM rank, row); the encoder side's rows are its micro-batches' shares
 * of the chunk, sp rank js holding the js-th part of each micro-batch. */
static void check_raster_routes(const plan_t *p, int per_image)
{
    char err[UTIL_ERR_LEN];
    int L = p->model.llm, R = plan_rows_per_sample(p, 0), G = 0;
    while (G * G < p->work.image_tokens) G++;
    const model_module *vm = &p->model.mod[0];
    int *raster = malloc((size_t)per_image * sizeof *raster);
    CHECK_OK(model_merged_raster(vm, G, G, raster, err));
    const plan_module *e = &p->mod[0];
    for (int c = 0; c < plan_chunks(p); c++) {
        plan_segment *sg;
        int n, checked = 0, blocks = 0;
        CHECK_OK(plan_handoff(p, 0, c, &sg, &n, err));
        for (int s = 0; s < n; s++) {
            if (!sg[s].act) continue;
            plan_coord ec, lc;
            CHECK(plan_rank_coord(p, 0, sg[s].enc_rank, &ec));
            CHECK(plan_rank_coord(p, L, sg[s].llm_rank, &lc));
            int *order = NULL;
            if (sg[s].block) {
                blocks++;
                order = malloc((size_t)sg[s].block * sizeof *order);
                CHECK_OK(plan_handoff_block_order(p, 0, sg[s].block, order, err));
                CHECK_EQ_INT(sg[s].rows % sg[s].block, 0);
            }
            int f, cnt, ef, en;
            plan_chunk_share(p, L, c, lc.dp, &f, &cnt);
            plan_chunk_share(p, 0, c, ec.dp, &ef, &en);
            for (int j = 0; j < sg[s].rows; j++) {
                /* the step row this encoder rank keeps at enc_off + j */
                int off = sg[s].enc_off + j, at = 0;
                long g = -1;
                for (int u = 0; u < plan_micro_count(e, en) && g < 0; u++) {
                    int uf, un;
                    plan_micro_range(e, ef, en, u, &uf, &un);
                    int rows = un * R / e->sp;
                    if (off < at + rows) g = (long)uf * R + (long)ec.sp * rows + (off - at);
                    at += rows;
                }
                int want_sp, want_row;
                expected_place(p, raster, per_image, g, f, &want_sp, &want_row);
                int got_row = sg[s].llm_off + j;
                if (order) got_row = sg[s].llm_off + j - j % sg[s].block + order[j % sg[s].block];
                CHECK_EQ_INT(lc.sp, want_sp);
                CHECK_EQ_INT(got_row, want_row);
                checked++;
            }
            free(order);
        }
        CHECK(checked > 0);
        CHECK(blocks > 0);   /* whole images and bands go as blocks, not row by row */
        util_free(sg);
    }
    free(raster);
}

TEST(handoff_puts_window_ordered_rows_in_raster_order)
{
    static plan_t p;
    const struct { const char *spec; plan_placement pl; int gpus, micro, batch, images, tokens; bool ring; } cases[] = {
        { "vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 1, 2, 1, 64, false },
        { "vision:sp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 4, 1, 64, false },          /* a window row each */
        { "vision:sp=4;llm:dp=2,sp=2", PLAN_COLOCATED, 4, 1, 4, 2, 256, false },             /* Ulysses over 2 images */
        { "vision:gpus=2,sp=2;llm:gpus=2,sp=2", PLAN_DISAGGREGATED, 4, 2, 4, 1, 256, true }, /* ring chunks cut images */
        { "vision:gpus=1;llm:gpus=2,sp=2", PLAN_DISAGGREGATED, 3, 2, 4, 3, 64, true },
        { "vision:dp=2;llm:dp=2", PLAN_COLOCATED, 2, 2, 8, 2, 144, false },                  /* 12 x 12: 3 x 3 windows */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = make_window_plan(cases[i].spec, cases[i].pl, cases[i].gpus, cases[i].micro, cases[i].batch, cases[i].images,
                                  cases[i].tokens, cases[i].ring, &p);
        CHECK_OK(rc);
        if (rc) continue;
        int per_image = cases[i].tokens / 4;
        check_raster_routes(&p, per_image);
        if (test_failed_now()) { fprintf(stderr, "case %zu: %s\n", i, cases[i].spec); return; }
    }
}
