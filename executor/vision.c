/* The vision encoder: patch embedding, the blocks (full attention per image,
 * window attention in the other layers) and the merger, forward and
 * backward, in activation slots so a pipelined schedule can keep several
 * micro-batches alive. Qwen2.5-VL's modeling_qwen2_5_vl.py is the reference. */
#include "executor/model_int.h"

#include <math.h>
#include <string.h>

int ex_patch_positions(const model_module *mm, int gh, int gw, int *rows, int *cols, char *err)
{
    int m = mm->merge > 0 ? mm->merge : 1;
    int side = mm->window > 0 ? (int)lround(sqrt((double)mm->window)) : m;
    if (side <= 0 || side % m)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: window %d is not a square of a multiple of merge %d", mm->name, mm->window, m);
    if (gh <= 0 || gw <= 0 || gh % side || gw % side)
        return util_fail(err, UTIL_EINVAL, "executor: batch: grid %dx%d is not a multiple of the %s window/merge side %d", gh, gw, mm->name, side);
    int i = 0;
    for (int wr = 0; wr < gh / side; wr++)
        for (int wc = 0; wc < gw / side; wc++)
            for (int ur = 0; ur < side / m; ur++)
                for (int uc = 0; uc < side / m; uc++)
                    for (int mr = 0; mr < m; mr++)
                        for (int mc = 0; mc < m; mc++) {
                            rows[i] = wr * side + ur * m + mr;
                            cols[i] = wc * side + uc * m + mc;
                            i++;
                        }
    return UTIL_OK;
}

/* Qwen2-VL vision rotary: rotary pairs i < hd/4 rotate by row * theta^(-4i/hd),
 * pairs hd/4 <= i < hd/2 by col * theta^(-4(i - hd/4)/hd). cos/sin [n, hd/2]. */
static void vision_rope_tables(ex_module *md, const int *rows, const int *cols, int patches, int row0, int n)
{
    int half = md->hd / 2, quarter = md->hd / 4;
    double inv[EX_MAX_HEAD_DIM / 4];
    for (int i = 0; i < quarter; i++) inv[i] = pow(EX_ROPE_THETA, -2.0 * i / (double)half);
    for (int t = 0; t < n; t++) {
        float *c = md->a.cos + (size_t)t * half, *sn = md->a.sin + (size_t)t * half;
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
    rc = ex_patch_positions(mm, b->grid_h, b->grid_w, rows, rows + P, err);
    if (!rc) vision_rope_tables(md, rows, rows + P, P, md->sp_rank * Nl, Nl);
    util_free(rows);
    if (rc) return rc;
    for (int i = 0; i <= b->n_images; i++) md->cu[i] = i * P;
    for (int i = 0; i <= n_win; i++) md->cu_win[i] = i * mm->window;
    md->n_seq = b->n_images;
    md->n_win = n_win;
    return UTIL_OK;
}

/* Vision forward: x0 = pixels[N, cpp] Wp^T + bp, the blocks, then the merger:
 * vout[N/m^2, out] = fc2(gelu(fc1(rmsnorm(xL) viewed as [N/m^2, m^2 d]))). */
static int vision_forward(ex_model *em, ex_module *md, const ex_batch *b, char *err)
{
    const model_module *mm = &md->mm;
    const ex_backend *be = em->be;
    int rc = vision_geometry(md, b, err);
    if (rc) return rc;
    int Nl = md->n_rows, Mr = Nl / (mm->merge * mm->merge), L = mm->layers;
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    ex_acts *a = &md->a;
    md->comm_rc = 0;
    ex_unit_begin(md, 0, EX_USE_FORWARD);
    be->linear_forward(a->blk[0].x, b->pixels, md->w.patch_w, md->w.patch_b, Nl, cpp, md->d);
    ex_unit_end(md, 0, EX_USE_FORWARD, false);
    ex_blocks_forward(be, md, md->cu, md->cu_win, false);
    ex_unit_begin(md, L + 1, EX_USE_FORWARD);
    be->rmsnorm_forward(a->mln, a->mrstd, a->x_final, md->w.merge_ln, Nl, md->d, EX_NORM_EPS);
    be->linear_forward(a->h1, a->mln, md->w.m0w, md->w.m0b, Mr, mm->proj_in, mm->proj_hidden);
    be->gelu_forward(a->a1, a->h1, (size_t)Mr * mm->proj_hidden);
    be->linear_forward(a->vout, a->a1, md->w.m2w, md->w.m2b, Mr, mm->proj_hidden, mm->out_hidden);
    ex_unit_end(md, L + 1, EX_USE_FORWARD, false);
    ex_slot_filled(md);
    return UTIL_OK;
}

/* Vision backward from dvout [N/m^2, out] down to the patch embedding weights. */
static void vision_backward(ex_model *em, ex_module *md, const ex_batch *b, const float *dvout)
{
    const model_module *mm = &md->mm;
    const ex_backend *be = em->be;
    ex_acts *a = &md->a;
    int N = md->n_rows, Mr = N / (mm->merge * mm->merge), L = mm->layers;
    size_t Mph = (size_t)Mr * mm->proj_hidden;
    ex_unit_begin(md, L + 1, EX_USE_BACKWARD);
    be->zero(a->da1, Mph);
    be->linear_backward(a->da1, md->g.m2w, md->g.m2b, dvout, a->a1, md->w.m2w, Mr, mm->proj_hidden, mm->out_hidden);
    be->zero(a->dh1, Mph);
    be->gelu_backward(a->dh1, a->da1, a->h1, Mph);
    be->zero(a->dln, (size_t)N * md->d);
    be->linear_backward(a->dln, md->g.m0w, md->g.m0b, a->dh1, a->mln, md->w.m0w, Mr, mm->proj_in, mm->proj_hidden);
    be->zero(a->dres, (size_t)N * md->d);
    be->rmsnorm_backward(a->dres, md->g.merge_ln, a->dln, a->x_final, md->w.merge_ln, a->mrstd, N, md->d);
    ex_unit_end(md, L + 1, EX_USE_BACKWARD, true);
    ex_blocks_backward(be, md, md->cu, md->cu_win, false);
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    ex_unit_begin(md, 0, EX_USE_BACKWARD);
    be->linear_backward(NULL, md->g.patch_w, md->g.patch_b, a->dres, b->pixels, md->w.patch_w, N, cpp, md->d);
    ex_unit_end(md, 0, EX_USE_BACKWARD, true);
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
    ex_module *md = vision_of(em);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_forward: no vision module on this model instance");
    int rc = ex_check_images(em, b, err);
    if (rc) return rc;
    if (b->n_images == 0) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_forward: batch has no images");
    if ((rc = vision_forward(em, md, b, err))) return rc;
    if (md->comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: vision %s failed with %d", ex_comm_what(md), md->comm_rc);
    *vis_out = md->a.vout;
    if (vis_rows) *vis_rows = b->n_images * ex_merged_per_image(em, b) / md->sp;
    return UTIL_OK;
}

int ex_vision_backward(ex_model *em, const ex_batch *b, const float *dvis, char *err)
{
    ex_module *md = vision_of(em);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_backward: no vision module on this model instance");
    if (!md->slot[md->cur].filled)
        return util_fail(err, UTIL_EINVAL, "executor: ex_vision_backward: slot %d holds no forward", md->cur);
    ex_slot_bind(md);
    if (md->n_rows * md->sp != b->n_images * b->patches)
        return util_fail(err, UTIL_EINVAL, "executor: ex_vision_backward: batch differs from slot %d's ex_vision_forward", md->cur);
    md->comm_rc = 0;
    if (!md->mm.frozen) vision_backward(em, md, b, dvis);
    if (md->comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: vision %s failed with %d", ex_comm_what(md), md->comm_rc);
    return UTIL_OK;
}

/* A micro-batch this rank has no samples of, while its shard group's other
 * ranks do: the unit hooks of a forward or a backward in the same order as
 * vision_forward and vision_backward, so every collective they issue is
 * matched (the Join of PyTorch's uneven-input DDP / FSDP). */
int ex_vision_empty_pass(ex_model *em, ex_unit_use use, char *err)
{
    ex_module *md = vision_of(em);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_empty_pass: no vision module on this model instance");
    int last = md->mm.layers + 1;
    bool back = use == EX_USE_BACKWARD;
    md->comm_rc = 0;
    if (back && md->mm.frozen) return UTIL_OK;
    for (int i = 0; i <= last; i++) {
        int u = back ? last - i : i;
        ex_unit_begin(md, u, use);
        ex_unit_end(md, u, use, back);
    }
    return md->comm_rc ? util_fail(err, UTIL_ERUNTIME, "executor: vision: an empty pass's collective failed with %d", md->comm_rc)
                       : UTIL_OK;
}
