/* LLaVA's CLIP vision tower (huggingface/transformers 4.49
 * src/transformers/models/clip/modeling_clip.py CLIPVisionTransformer, as
 * models/llava/modeling_llava.py LlavaForConditionalGeneration uses it):
 *   emb = [class_embedding; patches Wp^T] + position_embedding   per image,
 *         P + 1 rows (Conv2d without bias = the patches' linear, the class
 *         row first, positions 0 .. P)
 *   x0  = pre_layrnorm(emb)
 *   the `layers` pre-norm blocks (LayerNorm, attention without rotary over
 *   each image's rows, quick-GELU MLP: block.c); the tower's unused blocks
 *   and post_layernorm after them do not run (vision_feature_layer -2 reads
 *   hidden_states[-2], which no later block or norm touches)
 *   feat = the patch rows of xL (vision_feature_select_strategy "default"
 *          drops the class row)
 *   vout = linear_2(gelu(linear_1(feat)))   (LlavaMultiModalProjector, erf GELU)
 * Forward and backward run in activation slots with the unit hooks around
 * every unit's use, as vision.c does. The tower runs without sequence
 * parallelism (its class rows make the ranks' outputs unequal; the planner
 * refuses sp for it, planner/cost.c); tensor and data parallelism, ZeRO and
 * pipeline stages are the blocks' and units' own. */
#include "executor/encoder_int.h"

#include <string.h>

int ex_check_clip_module(const model_module *mm, const model_module *llm, char *err)
{
    const char *n = mm->name;
    if (mm->in_channels <= 0 || mm->patch <= 0 || mm->max_positions < 2)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: in_channels, patch > 0 and max_positions >= 2 are needed", n);
    if (mm->merge != 1 || mm->temporal_patch != 1 || mm->window > 0 || mm->pool > 1)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: merge, temporal_patch, pool and window attention do not apply to a CLIP tower", n);
    if (mm->norm != MODEL_NORM_LAYERNORM || !mm->pre_norm || mm->patch_bias || mm->proj_norm || mm->proj_hidden <= 0 ||
        !mm->proj_bias)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: the CLIP tower is LLaVA's: LayerNorm blocks, pre_norm, "
                         "no patch bias, a two-linear projector with biases and no proj_norm", n);
    if (mm->proj_in != mm->hidden)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: proj_in %d != hidden %d", n, mm->proj_in, mm->hidden);
    if (mm->out_hidden != llm->hidden)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: out_hidden %d != llm hidden %d", n, mm->out_hidden, llm->hidden);
    return UTIL_OK;
}

/* transformers' CLIPVisionEmbeddings refuses an image of another size
 * (without interpolate_pos_encoding): the positions are the patches and the class row. */
static int check_batch(const ex_module *md, const ex_batch *b, char *err)
{
    if (b->patches + 1 != md->mm.max_positions)
        return util_fail(err, UTIL_EINVAL, "executor: batch: %d patches per image + the class row != %s's %d positions "
                         "(images of its image_size)", b->patches, md->mm.name, md->mm.max_positions);
    if (md->sp > 1)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: sp_size %d: the CLIP tower runs without sequence parallelism",
                         md->mm.name, md->sp);
    return UTIL_OK;
}

int ex_clip_rows(const ex_module *md, const ex_batch *b) { (void)md; return b->n_images * (b->patches + 1); }

/* emb = [cls; pixels Wp^T] + positions per image, then x0 = pre_layrnorm(emb);
 * px: the batch's pixels in the backend's memory (the slot's input). */
static int stem_forward(const ex_backend *be, ex_module *md, const ex_batch *b, const float *px, float *x0, char *err)
{
    (void)err;
    const model_module *mm = &md->mm;
    int d = md->d, P = b->patches, R = P + 1, cpp = mm->in_channels * mm->patch * mm->patch;
    float *emb = md->a.clip_emb;
    for (int i = 0; i < b->n_images; i++) {
        float *rows = emb + (size_t)i * R * d;
        be->copy(rows, md->w.cls, (size_t)d);
        be->linear_forward(rows + d, px + (size_t)i * P * cpp, md->w.patch_w, NULL, P, cpp, d);
        be->add_inplace(rows, md->w.pos, (size_t)R * d);
    }
    be->layernorm_forward(x0, md->a.clip_mean, md->a.clip_rstd, emb, md->w.pre_ln, md->w.pre_ln_b, md->n_rows, d,
                          (float)model_norm_eps(&md->mm));
    return UTIL_OK;
}

/* From dres = dL/d(x0): pre_layrnorm's, the positions', the class
 * embedding's and the patch weights' gradients (dln holds dL/d(emb)). */
static void stem_backward(const ex_backend *be, ex_module *md, const ex_batch *b)
{
    const float *px = md->slot[md->cur].in_dev;   /* b->pixels, uploaded by the forward into this slot */
    const model_module *mm = &md->mm;
    ex_acts *a = &md->a;
    int d = md->d, P = b->patches, R = P + 1, cpp = mm->in_channels * mm->patch * mm->patch;
    be->zero(a->dln, (size_t)md->n_rows * d);
    be->layernorm_backward(a->dln, md->g.pre_ln, md->g.pre_ln_b, a->dres, a->clip_emb, md->w.pre_ln, a->clip_mean,
                           a->clip_rstd, md->n_rows, d);
    for (int i = 0; i < b->n_images; i++) {
        const float *drows = a->dln + (size_t)i * R * d;
        be->add_inplace(md->g.pos, drows, (size_t)R * d);
        be->add_inplace(md->g.cls, drows, (size_t)d);
        be->linear_backward(NULL, md->g.patch_w, NULL, drows + d, px + (size_t)i * P * cpp, md->w.patch_w, P,
                            cpp, d);
    }
}

/* The head: the projector over the patch rows (the class rows dropped), vout [n_images P, out]. */
static void head_forward(const ex_backend *be, ex_module *md, const ex_batch *b, ex_stage_io *io)
{
    ex_acts *a = &md->a;
    int P = b->patches, R = P + 1, M = b->n_images * P, d = md->d;
    for (int i = 0; i < b->n_images; i++)
        be->copy(a->mln + (size_t)i * P * d, a->x_final + ((size_t)i * R + 1) * d, (size_t)P * d);
    ex_projector_forward(be, md, a->mln, M);
    io->out = a->vout;
    io->out_rows = M;
}

static void head_backward(const ex_backend *be, ex_module *md, const ex_batch *b, const float *dout)
{
    ex_acts *a = &md->a;
    int P = b->patches, R = P + 1, M = b->n_images * P, d = md->d;
    ex_projector_backward(be, md, a->mln, dout, a->dln, M);
    be->zero(a->dres, (size_t)md->n_rows * d);   /* the class rows get no gradient from the projector */
    for (int i = 0; i < b->n_images; i++)
        be->copy(a->dres + ((size_t)i * R + 1) * d, a->dln + (size_t)i * P * d, (size_t)P * d);
}

static const ex_encoder_parts clip_parts = { stem_forward, head_forward, head_backward, stem_backward };

/* CLIP forward of this stage: the stem on the first stage (else the
 * previous stage's rows), the stage's blocks, and on the last stage the
 * projector over the patch rows: vout [n_images P, out]. */
int ex_clip_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    const model_module *mm = &md->mm;
    int rc = ex_check_images(em, b, err);
    if (!rc && b->n_images == 0) rc = util_fail(err, UTIL_EINVAL, "executor: %s forward: batch has no images", mm->name);
    if (!rc) rc = check_batch(md, b, err);
    if (!rc && !md->stage.stem && !io->in) rc = util_fail(err, UTIL_EINVAL, "executor: %s stage %d forward: no input rows", mm->name, md->stage_index);
    int P = b->patches, R = P + 1, N = b->n_images * R, M = b->n_images * P;
    if (!rc) rc = ex_acts_ensure(md, N, M, 0, 0, 0, b->n_images, err);
    if (rc) return rc;
    for (int i = 0; i <= b->n_images; i++) md->cu[i] = md->cu_win[i] = i * R;
    md->n_seq = md->n_win = b->n_images;
    ex_cu_upload(md, md->n_seq, md->n_win);   /* the kernels read the backend's copies */
    size_t cpp = (size_t)mm->in_channels * mm->patch * mm->patch;
    return ex_encoder_stage_run_forward(em->be, md, b, b->pixels, (size_t)M * cpp * sizeof(float), &clip_parts, io, err);
}

/* CLIP backward of this stage, from dvout [n_images P, out] on the last
 * stage (else the next stage's gradient of this stage's rows), down to the
 * stem's weights on the first (else the gradient of the stage's input rows). */
int ex_clip_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    int rc = ex_encoder_backward_begin(md, ex_clip_rows(md, b), io, err);
    return rc ? rc : ex_encoder_stage_run_backward(em->be, md, b, &clip_parts, io, err);
}
