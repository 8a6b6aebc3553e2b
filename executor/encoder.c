/* The whole-encoder calls of one encoder module (ex_vision_* / ex_audio_*
 * in executor.h): one stage run on this instance's module, by index, with
 * the caller's name in the error when the instance does not hold it; and
 * what the encoders' stages share: the stage pass around their stems and
 * heads (encoder_int.h), the vision projector, a pass's start and end. */
#include "executor/encoder_int.h"

static ex_module *encoder_at(ex_model *em, int k) { return k >= 0 ? ex_module_at(em, k) : NULL; }

static int not_held(const char *call, const char *kind, char *err)
{
    return util_fail(err, UTIL_EINVAL, "executor: %s: no %s module on this model instance", call, kind);
}

int ex_encoder_forward(ex_model *em, int k, const char *call, const char *kind, const ex_batch *b, const float **out,
                       int *rows, char *err)
{
    if (!encoder_at(em, k)) return not_held(call, kind, err);
    ex_stage_io io = { 0 };
    int rc = ex_stage_forward(em, k, b, &io, err);
    if (rc) return rc;
    *out = io.out;
    if (rows) *rows = io.out_rows;
    return UTIL_OK;
}

int ex_encoder_backward(ex_model *em, int k, const char *call, const char *kind, const ex_batch *b, const float *dout,
                        char *err)
{
    if (!encoder_at(em, k)) return not_held(call, kind, err);
    ex_stage_io io = { .in = dout };
    return ex_stage_backward(em, k, b, &io, err);
}

int ex_encoder_empty_pass(ex_model *em, int k, const char *call, const char *kind, ex_unit_use use, char *err)
{
    if (k < 0) return not_held(call, kind, err);
    return ex_stage_empty_pass(em, k, use, err);
}

/* The two-linear GELU projector of a vision encoder's head (Qwen2.5-VL's
 * merger MLP, LLaVA's multi_modal_projector): vout = fc2(gelu(fc1(in))) over
 * M rows of proj_in, keeping h1 and a1 for the backward. */
void ex_projector_forward(const ex_backend *be, ex_module *md, const float *in, int M)
{
    const model_module *mm = &md->mm;
    ex_acts *a = &md->a;
    be->linear_forward(a->h1, in, md->w.m0w, md->w.m0b, M, mm->proj_in, mm->proj_hidden);
    be->gelu_forward(a->a1, a->h1, (size_t)M * mm->proj_hidden);
    be->linear_forward(a->vout, a->a1, md->w.m2w, md->w.m2b, M, mm->proj_hidden, mm->out_hidden);
}

/* Its backward from dout [M, out_hidden]: the weights' gradients, and din
 * [M, proj_in] = dL/d(in) (overwritten). */
void ex_projector_backward(const ex_backend *be, ex_module *md, const float *in, const float *dout, float *din, int M)
{
    const model_module *mm = &md->mm;
    ex_acts *a = &md->a;
    size_t Mph = (size_t)M * mm->proj_hidden;
    be->zero(a->da1, Mph);
    be->linear_backward(a->da1, md->g.m2w, md->g.m2b, dout, a->a1, md->w.m2w, M, mm->proj_hidden, mm->out_hidden);
    be->zero(a->dh1, Mph);
    be->gelu_backward(a->dh1, a->da1, a->h1, Mph);
    be->zero(din, (size_t)M * mm->proj_in);
    be->linear_backward(din, md->g.m0w, md->g.m0b, a->dh1, in, md->w.m0w, M, mm->proj_in, mm->proj_hidden);
}

/* The end of an encoder stage's pass: a forward marks its slot filled; a
 * failed collective or unit hook becomes the pass's error. */
int ex_encoder_pass_end(ex_module *md, bool forward, char *err)
{
    if (forward) ex_slot_filled(md);
    if (md->comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: %s %s failed with %d", md->mm.name, ex_comm_what(md), md->comm_rc);
    return UTIL_OK;
}

/* The start of an encoder stage's backward: the current slot holds a
 * forward of this batch (rows: the batch's rows on this rank), bound, and
 * an output gradient comes in; io's output and the collectives' code reset. */
int ex_encoder_backward_begin(ex_module *md, int rows, ex_stage_io *io, char *err)
{
    const char *n = md->mm.name;
    if (!md->slot[md->cur].filled)
        return util_fail(err, UTIL_EINVAL, "executor: %s backward: slot %d holds no forward", n, md->cur);
    ex_slot_bind(md);
    if (md->n_rows != rows)
        return util_fail(err, UTIL_EINVAL, "executor: %s backward: batch differs from slot %d's forward", n, md->cur);
    if (!io->in) return util_fail(err, UTIL_EINVAL, "executor: %s stage %d backward: no output gradient", n, md->stage_index);
    io->out = NULL;
    io->out_rows = 0;
    md->comm_rc = 0;
    return UTIL_OK;
}

int ex_encoder_stage_run_forward(const ex_backend *be, ex_module *md, const ex_batch *b, const void *input,
                                 size_t in_bytes, const ex_encoder_parts *parts, ex_stage_io *io, char *err)
{
    ex_acts *a = &md->a;
    int L = md->mm.layers, N = md->n_rows;
    float *x0 = ex_stage_input(md);
    md->comm_rc = 0;
    if (md->stage.stem) {
        const float *in = ex_slot_input(md, input, in_bytes, false, err);
        if (!in) return UTIL_ENOMEM;
        ex_unit_begin(md, 0, EX_USE_FORWARD);
        int rc = parts->stem_forward(be, md, b, in, x0, err);
        ex_unit_end(md, 0, EX_USE_FORWARD, false);
        if (rc) return rc;
    } else {
        be->copy(x0, io->in, (size_t)N * md->d);
    }
    ex_blocks_forward(be, md, md->cu_dev, md->cu_win_dev, false);
    io->out = a->x_final;
    io->out_rows = N;
    if (md->stage.head) {
        ex_unit_begin(md, L + 1, EX_USE_FORWARD);
        parts->head_forward(be, md, b, io);
        ex_unit_end(md, L + 1, EX_USE_FORWARD, false);
    }
    return ex_encoder_pass_end(md, true, err);
}

int ex_encoder_stage_run_backward(const ex_backend *be, ex_module *md, const ex_batch *b,
                                  const ex_encoder_parts *parts, ex_stage_io *io, char *err)
{
    if (!model_runs_backward(&md->mm)) return UTIL_OK;   /* a frozen encoder */
    ex_acts *a = &md->a;
    int L = md->mm.layers, N = md->n_rows;
    if (md->stage.head) {
        ex_unit_begin(md, L + 1, EX_USE_BACKWARD);
        parts->head_backward(be, md, b, io->in);
        ex_unit_end(md, L + 1, EX_USE_BACKWARD, true);
    } else {
        be->copy(a->dres, io->in, (size_t)N * md->d);
    }
    ex_blocks_backward(be, md, md->cu_dev, md->cu_win_dev, false);
    if (md->stage.stem) {
        ex_unit_begin(md, 0, EX_USE_BACKWARD);
        parts->stem_backward(be, md, b);
        ex_unit_end(md, 0, EX_USE_BACKWARD, true);
    } else {
        io->out = a->dres;
        io->out_rows = N;
    }
    return ex_encoder_pass_end(md, false, err);
}
