/* The whole-encoder calls of one encoder module (ex_vision_* / ex_audio_*
 * in executor.h): one stage run on this instance's module, by index, with
 * the caller's name in the error when the instance does not hold it. */
#include "executor/model_int.h"

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
