/* The stage pass that vision.c, clip.c and audio.c share (encoder.c): the
 * stem on the first stage (else the previous stage's rows), the stage's
 * blocks, the head on the last stage (else the blocks' rows out), each
 * part inside its unit hooks; the backward the same way in reverse. An
 * encoder supplies its stem and head. */
#ifndef DHP_EXECUTOR_ENCODER_INT_H
#define DHP_EXECUTOR_ENCODER_INT_H

#include "executor/model_int.h"

typedef struct {
    /* x0 [n_rows, d] from the batch's input (in: on the backend, the slot's copy). */
    int (*stem_forward)(const ex_backend *be, ex_module *md, const ex_batch *b, const float *in, float *x0, char *err);
    /* From md->a.x_final: the stage's output, io->out [io->out_rows, out_hidden]. */
    void (*head_forward)(const ex_backend *be, ex_module *md, const ex_batch *b, ex_stage_io *io);
    /* From dout = dL/d(head output): md->a.dres = dL/d(x_final) and the head's weight gradients. */
    void (*head_backward)(const ex_backend *be, ex_module *md, const ex_batch *b, const float *dout);
    /* From md->a.dres = dL/d(x0): the stem's weight gradients. */
    void (*stem_backward)(const ex_backend *be, ex_module *md, const ex_batch *b);
} ex_encoder_parts;

/* The forward after the encoder's checks and geometry (md->n_rows set, the
 * slot bound): input (in_bytes of host memory) is the stem's input. */
int ex_encoder_stage_run_forward(const ex_backend *be, ex_module *md, const ex_batch *b, const void *input,
                                 size_t in_bytes, const ex_encoder_parts *parts, ex_stage_io *io, char *err);
/* The backward after ex_encoder_backward_begin (none for a frozen encoder). */
int ex_encoder_stage_run_backward(const ex_backend *be, ex_module *md, const ex_batch *b,
                                  const ex_encoder_parts *parts, ex_stage_io *io, char *err);

#endif
