/* The vision encoder: patch embedding, the blocks (full attention per image,
 * window attention in the other layers) and the merger, forward and
 * backward, in activation slots so a pipelined schedule can keep several
 * micro-batches alive. Qwen2.5-VL's modeling_qwen2_5_vl.py is the reference. */
#include "executor/encoder_int.h"

#include <math.h>
#include <string.h>

/* Qwen2-VL vision rotary: rotary pairs i < hd/4 rotate by row * theta^(-4i/hd),
 * pairs hd/4 <= i < hd/2 by col * theta^(-4(i - hd/4)/hd). cos/sin [n, hd/2]. */
static int vision_rope_tables(ex_module *md, const int *rows, const int *cols, int patches, int row0, int n, char *err)
{
    int half = md->hd / 2, quarter = md->hd / 4;
    double inv[EX_MAX_HEAD_DIM / 4];
    for (int i = 0; i < quarter; i++) inv[i] = pow(EX_ROPE_THETA, -2.0 * i / (double)half);
    float *hc, *hs;   /* host staging, copied to md->a.cos / sin after */
    int rc = ex_rope_host(md, (size_t)n, &hc, &hs, err);
    if (rc) return rc;
    for (int t = 0; t < n; t++) {
        float *c = hc + (size_t)t * half, *sn = hs + (size_t)t * half;
        if (t >= patches) {   /* the same patch of the previous image */
            memcpy(c, c - (size_t)patches * half, (size_t)half * sizeof *c);
            memcpy(sn, sn - (size_t)patches * half, (size_t)half * sizeof *sn);
            continue;
        }
        int p = (row0 + t) % patches;
        for (int i = 0; i < half; i++) {
            double ang = (i < quarter ? rows[p] * inv[i] : cols[p] * inv[i - quarter]);
            c[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
    }
    ex_rope_upload(md, (size_t)n);
    return UTIL_OK;
}

static ex_module *vision_of(ex_model *em) { return em->vis_index >= 0 ? ex_module_at(em, em->vis_index) : NULL; }

/* The batch's geometry in the slot: rope tables, per-image and per-window sequences. */
static int vision_geometry(ex_module *md, const ex_batch *b, char *err)
{
    const model_module *mm = &md->mm;
    int P = b->patches, N = b->n_images * P, mm2 = mm->merge * mm->merge;
    int n_win = mm->window > 0 ? N / mm->window : 0;
    if (N % md->sp || (N / md->sp) % mm2)
        return util_fail(err, UTIL_EINVAL, "executor: batch: %d patches do not split into sp_size %d parts of whole merge groups", N, md->sp);
    int Nl = N / md->sp, Mr = Nl / mm2;
    int rc = ex_acts_ensure(md, Nl, Mr, 0, 0, 0, (b->n_images > n_win ? b->n_images : n_win), err);
    if (rc) return rc;
    int *rows = util_malloc((size_t)P * 2 * sizeof(int));
    if (!rows) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    rc = model_patch_order(mm, b->grid_h, b->grid_w, rows, rows + P, err);
    if (!rc) rc = vision_rope_tables(md, rows, rows + P, P, md->sp_rank * Nl, Nl, err);
    util_free(rows);
    if (rc) return rc;
    for (int i = 0; i <= b->n_images; i++) md->cu[i] = i * P;
    for (int i = 0; i <= n_win; i++) md->cu_win[i] = i * mm->window;
    md->n_seq = b->n_images;
    md->n_win = n_win;
    ex_cu_upload(md, md->n_seq, md->n_win);
    return UTIL_OK;
}

int ex_vision_rows(const ex_module *md, const ex_batch *b) { return b->n_images * b->patches / md->sp; }

/* The stem: x0 = pixels[N, cpp] Wp^T + bp. */
static int stem_forward(const ex_backend *be, ex_module *md, const ex_batch *b, const float *px, float *x0, char *err)
{
    (void)b; (void)err;
    const model_module *mm = &md->mm;
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    be->linear_forward(x0, px, md->w.patch_w, md->w.patch_b, md->n_rows, cpp, md->d);
    return UTIL_OK;
}

static void stem_backward(const ex_backend *be, ex_module *md, const ex_batch *b)
{
    (void)b;
    const model_module *mm = &md->mm;
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    const float *px = md->slot[md->cur].in_dev;   /* b->pixels, uploaded by the forward into this slot */
    be->linear_backward(NULL, md->g.patch_w, md->g.patch_b, md->a.dres, px, md->w.patch_w, md->n_rows, cpp, md->d);
}

/* The merger: vout[N/m^2, out] = fc2(gelu(fc1(rmsnorm(xL) viewed as [N/m^2, m^2 d]))). */
static void head_forward(const ex_backend *be, ex_module *md, const ex_batch *b, ex_stage_io *io)
{
    (void)b;
    ex_acts *a = &md->a;
    int N = md->n_rows, Mr = N / (md->mm.merge * md->mm.merge);
    be->rmsnorm_forward(a->mln, a->mrstd, a->x_final, md->w.merge_ln, N, md->d, (float)model_norm_eps(&md->mm));
    ex_projector_forward(be, md, a->mln, Mr);
    io->out = a->vout;
    io->out_rows = Mr;
}

static void head_backward(const ex_backend *be, ex_module *md, const ex_batch *b, const float *dout)
{
    (void)b;
    ex_acts *a = &md->a;
    int N = md->n_rows, Mr = N / (md->mm.merge * md->mm.merge);
    ex_projector_backward(be, md, a->mln, dout, a->dln, Mr);   /* proj_in = d m^2: all N rows of dln */
    be->zero(a->dres, (size_t)N * md->d);
    be->rmsnorm_backward(a->dres, md->g.merge_ln, a->dln, a->x_final, md->w.merge_ln, a->mrstd, N, md->d);
}

static const ex_encoder_parts vision_parts = { stem_forward, head_forward, head_backward, stem_backward };

/* Vision forward of this stage: the patch embedding on the first stage
 * (else the previous stage's rows), the stage's blocks, then on the last
 * stage the merger. */
int ex_vision_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    const model_module *mm = &md->mm;
    int rc = ex_check_images(em, b, err);
    if (!rc && b->n_images == 0) rc = util_fail(err, UTIL_EINVAL, "executor: %s forward: batch has no images", mm->name);
    if (!rc && !md->stage.stem && !io->in) rc = util_fail(err, UTIL_EINVAL, "executor: %s stage %d forward: no input rows", mm->name, md->stage_index);
    if (!rc) rc = vision_geometry(md, b, err);
    if (rc) return rc;
    size_t cpp = (size_t)mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    return ex_encoder_stage_run_forward(em->be, md, b, b->pixels, (size_t)md->n_rows * cpp * sizeof(float), &vision_parts,
                                        io, err);
}

/* Vision backward of this stage, from the merged rows' gradient dvout
 * [N/m^2, out] on the last stage (else the next stage's gradient of this
 * stage's rows), down to the patch embedding's weights on the first stage
 * (else the gradient of the stage's input rows). */
int ex_vision_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    int rc = ex_encoder_backward_begin(md, ex_vision_rows(md, b), io, err);
    return rc ? rc : ex_encoder_stage_run_backward(em->be, md, b, &vision_parts, io, err);
}

int ex_vision_set_slot(ex_model *em, int slot, char *err)
{
    ex_module *md = vision_of(em);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_set_slot: no vision module on this model instance");
    if (slot < 0 || slot >= EX_MAX_SLOTS)
        return util_fail(err, UTIL_EINVAL, "executor: ex_vision_set_slot: slot %d outside 0..%d", slot, EX_MAX_SLOTS - 1);
    md->cur = slot;
    return UTIL_OK;
}

int ex_check_images(const ex_model *em, const ex_batch *b, char *err)
{
    if (b->n_images < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: n_images %d < 0", b->n_images);
    if (b->n_images == 0) return UTIL_OK;
    if (em->vis_index < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: %d images but the model has no vision encoder", b->n_images);
    const model_module *vm = &em->m.mod[em->vis_index];
    if (!b->pixels || !b->images_per_sample)
        return util_fail(err, UTIL_EINVAL, "executor: batch: images without pixels or images_per_sample");
    if (b->patches != b->grid_h * b->grid_w)
        return util_fail(err, UTIL_EINVAL, "executor: batch: patches %d != grid %dx%d", b->patches, b->grid_h, b->grid_w);
    if (vm->window > 0 && b->patches % vm->window)
        return util_fail(err, UTIL_EINVAL, "executor: batch: patches %d not a multiple of window %d", b->patches, vm->window);
    if (b->patches % (vm->merge * vm->merge))
        return util_fail(err, UTIL_EINVAL, "executor: batch: patches %d not a multiple of merge^2 %d", b->patches, vm->merge * vm->merge);
    return UTIL_OK;
}

int ex_merged_per_image(const ex_model *em, const ex_batch *b)
{
    if (b->n_images == 0 || em->vis_index < 0) return 0;
    int m = em->m.mod[em->vis_index].merge;
    return b->patches / (m * m);
}

int ex_vision_forward(ex_model *em, const ex_batch *b, const float **vis_out, int *vis_rows, char *err)
{
    return ex_encoder_forward(em, em->vis_index, "ex_vision_forward", "vision", b, vis_out, vis_rows, err);
}

int ex_vision_backward(ex_model *em, const ex_batch *b, const float *dvis, char *err)
{
    return ex_encoder_backward(em, em->vis_index, "ex_vision_backward", "vision", b, dvis, err);
}

/* A micro-batch this rank has no samples of, while its shard group's other
 * ranks do: only the unit hooks (ex_stage_empty_pass). */
int ex_vision_empty_pass(ex_model *em, ex_unit_use use, char *err)
{
    return ex_encoder_empty_pass(em, em->vis_index, "ex_vision_empty_pass", "vision", use, err);
}
