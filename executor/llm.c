/* The decoder LLM: embeddings (the encoders' rows first, vision then audio,
 * then the sample's text), causal blocks, and the head over the predicting
 * rows only (final norm, vocab-parallel LM head and cross-entropy), forward
 * and backward; and the whole-model step that runs the encoders and the LLM
 * in one instance.
 * Qwen2's modeling_qwen2.py is the reference. */
#include "executor/model_int.h"

#include <math.h>
#include <string.h>

static ex_module *llm_of(ex_model *em) { return ex_module_at(em, em->m.llm); }

/* Context parallelism (sp > 1): every sample has S positions, of which this
 * rank holds those of its span (plan_cp_span_of), Sl of them. Without it, a
 * sample's span is all its positions. */
static int encoder_rows(const ex_model *em, const ex_batch *b, int s)
{
    int rows[MODEL_MAX_MODULES] = { 0 };
    if (em->vis_index >= 0 && b->images_per_sample) rows[em->vis_index] = b->images_per_sample[s] * ex_merged_per_image(em, b);
    if (em->aud_index >= 0 && b->audio_per_sample) rows[em->aud_index] = b->audio_per_sample[s] * ex_audio_rows_per_clip(em, b);
    return plan_sample_offset(&em->m, rows, em->m.n_modules);
}

/* Sample s's LLM positions: its encoders' rows, then its text. */
static int sample_len(const ex_model *em, const ex_batch *b, int s) { return encoder_rows(em, b, s) + b->text_tokens; }

static plan_cp_span sample_span(const ex_model *em, const ex_module *md, const ex_batch *b, int s)
{
    return plan_cp_span_of(plan_cp_of(&md->mm, &md->strat), sample_len(em, b, s), md->sp, md->sp_rank);
}

/* Sample s's first local row: its rows on this rank come sample after sample
 * (md->cu counts the attention's rows, which under Ulysses are all of them). */
static int row0(const ex_module *md, const ex_model *em, const ex_batch *b, int s)
{
    if (md->sp <= 1) return md->cu[s];
    plan_cp_span sp0 = sample_span(em, md, b, 0);
    return s * plan_cp_rows(&sp0);
}

/* The rotary base: the model's rope_theta (transformers' config), else 10000. */
static double rope_theta(const ex_module *md) { return md->mm.rope_theta > 0 ? md->mm.rope_theta : EX_ROPE_THETA; }

/* Multimodal RoPE (Qwen2-VL / 2.5-VL, transformers' get_rope_index and
 * apply_multimodal_rotary_pos_emb): position p of sample s has a (t, h, w)
 * triple. Its images come first: image i's merged token at merged-grid
 * (row, col) is (st, st + row, st + col) with st the image's start, and
 * the next image or the text starts at st + max(grid rows, grid cols) (a
 * still image's temporal grid is 1); text token j is (st + j) x 3. Rotary
 * pair i takes its angle from t, h or w by mrope_section (t pairs first). */
static void mrope_position(const ex_model *em, const ex_batch *b, int s, int p, int pos[3])
{
    int nimg = b->images_per_sample ? b->images_per_sample[s] : 0, mpi = ex_merged_per_image(em, b), adv = 0, gw = 1;
    if (nimg > 0) {
        const model_module *v = &em->m.mod[em->vis_index];
        int gh = b->grid_h / v->merge;
        gw = b->grid_w / v->merge;
        adv = gh > gw ? gh : gw;
    }
    if (p < nimg * mpi) {   /* an image's merged tokens come in raster order (models/geometry.c) */
        int st = (p / mpi) * adv, j = p % mpi;
        pos[0] = st;
        pos[1] = st + j / gw;
        pos[2] = st + j % gw;
        return;
    }
    pos[0] = pos[1] = pos[2] = nimg * adv + p - nimg * mpi;
}

/* Every local row's table, sample by sample (samples with other image
 * counts have other positions). */
static void mrope_tables(ex_model *em, ex_module *md, const ex_batch *b, const double *inv, float *hc, float *hs)
{
    int half = md->hd / 2;
    const int *sec = md->mm.mrope_section;
    for (int s = 0; s < md->n_seq; s++) {
        plan_cp_span span = sample_span(em, md, b, s);
        int n = plan_cp_rows(&span);
        float *c = hc + (size_t)row0(md, em, b, s) * half, *sn = hs + (size_t)row0(md, em, b, s) * half;
        for (int t = 0; t < n; t++) {
            int pos[3];
            mrope_position(em, b, s, plan_cp_position(&span, t), pos);
            for (int i = 0; i < half; i++) {
                double ang = pos[i < sec[0] ? 0 : i < sec[0] + sec[1] ? 1 : 2] * inv[i];
                c[(size_t)t * half + i] = (float)cos(ang);
                sn[(size_t)t * half + i] = (float)sin(ang);
            }
        }
    }
}

/* 1-D RoPE at each local row's position within its sample: pair i rotates by
 * p * theta^(-2i/hd). The sample with the most local rows gets the table;
 * every other one's positions are a prefix of its (all samples share one
 * span under context parallelism). With mrope_section, mrope_tables. */
static int llm_rope_tables(ex_model *em, ex_module *md, const ex_batch *b, char *err)
{
    int half = md->hd / 2, longest = 0;
    double inv[EX_MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++) inv[i] = pow(rope_theta(md), -2.0 * i / (double)md->hd);
    float *hc, *hs;   /* host staging, copied to md->a.cos / sin at the end */
    int rc = ex_rope_host(md, (size_t)md->n_rows, &hc, &hs, err);
    if (rc) return rc;
    if (md->mm.n_mrope) {
        mrope_tables(em, md, b, inv, hc, hs);
        ex_rope_upload(md, (size_t)md->n_rows);
        return UTIL_OK;
    }
    plan_cp_span span[2];
    for (int s = 1; s < md->n_seq; s++) {
        span[0] = sample_span(em, md, b, s);
        span[1] = sample_span(em, md, b, longest);
        if (plan_cp_rows(&span[0]) > plan_cp_rows(&span[1])) longest = s;
    }
    span[0] = sample_span(em, md, b, longest);
    int n0 = plan_cp_rows(&span[0]), r0 = row0(md, em, b, longest);
    float *c0 = hc + (size_t)r0 * half, *s0 = hs + (size_t)r0 * half;
    for (int t = 0; t < n0; t++) {
        int p = plan_cp_position(&span[0], t);
        for (int i = 0; i < half; i++) {
            double ang = p * inv[i];
            c0[(size_t)t * half + i] = (float)cos(ang);
            s0[(size_t)t * half + i] = (float)sin(ang);
        }
    }
    for (int s = 0; s < md->n_seq; s++) {
        if (s == longest) continue;
        span[1] = sample_span(em, md, b, s);
        size_t n = (size_t)plan_cp_rows(&span[1]) * half, at = (size_t)row0(md, em, b, s) * half;
        memcpy(hc + at, c0, n * sizeof *c0);
        memcpy(hs + at, s0, n * sizeof *s0);
    }
    ex_rope_upload(md, (size_t)md->n_rows);
    return UTIL_OK;
}

/* The predictions this rank holds: position R + t of sample s (its text
 * token t, t < T - 1) predicts token t + 1 where loss_mask[s * T + t] != 0
 * (all of them without a mask); their local rows and targets into rows and
 * targets when given. Returns how many. */
static int held_predictions(const ex_model *em, const ex_module *md, const ex_batch *b, int *rows, int32_t *targets)
{
    int T = b->text_tokens, k = 0;
    for (int s = 0; s < b->batch; s++) {
        plan_cp_span span = sample_span(em, md, b, s);
        int R = sample_len(em, b, s) - T, r0 = rows ? row0(md, em, b, s) : 0;
        for (int i = 0; i < span.n; i++)
            for (int p = span.lo[i] > R ? span.lo[i] : R; p < span.hi[i] && p < R + T - 1; p++) {
                int t = p - R;
                if (b->loss_mask && b->loss_mask[(size_t)s * T + t] == 0) continue;
                if (rows) {
                    rows[k] = r0 + plan_cp_local(&span, p);
                    targets[k] = b->tokens[(size_t)s * T + t + 1];
                }
                k++;
            }
    }
    return k;
}

/* Token embeddings of this rank's text rows and the encoders' rows into x0:
 * sample s's local rows start with the encoder rows it holds (enc_in holds
 * them sample after sample), then its text rows, one run per range of its
 * span. Vocab-parallel (tp > 1): each rank looks up the held text tokens in
 * its vocab rows (others zero) into emb, one allreduce_sum over the group
 * completes the rows (Megatron VocabParallelEmbedding). Under sequence
 * parallelism all N rows are built in tp_full and the first block's input
 * is this rank's N / tp of them. */
static void llm_embed(ex_model *em, ex_module *md, const ex_batch *b, const float *enc_in)
{
    const ex_backend *be = em->be;
    const int32_t *tokens = md->slot[md->cur].tok_dev;   /* b->tokens on the backend (ex_llm_stage_forward) */
    int T = b->text_tokens, B = b->batch, d = md->d;
    float *x0 = md->seqpar ? md->a.tp_full : ex_stage_input(md), *emb = md->a.emb;
    bool vp = md->tp > 1;
    int e = 0;
    if (vp && md->sp <= 1) {   /* every text token, in one call */
        be->embedding_forward(emb, md->w.wte, tokens, B * T, d, md->vocab0, md->vocab_n);
        e = B * T;
    } else if (vp) {
        for (int s = 0; s < B; s++) {
            plan_cp_span span = sample_span(em, md, b, s);
            int R = sample_len(em, b, s) - T;
            for (int i = 0; i < span.n; i++) {
                int a = span.lo[i] > R ? span.lo[i] : R;
                if (a >= span.hi[i]) continue;
                be->embedding_forward(emb + (size_t)e * d, md->w.wte, tokens + (size_t)s * T + a - R, span.hi[i] - a, d,
                                      md->vocab0, md->vocab_n);
                e += span.hi[i] - a;
            }
        }
    }
    if (vp) ex_tp_allreduce(md, emb, (size_t)e * d);
    int vis = 0;
    e = 0;
    for (int s = 0; s < B; s++) {
        plan_cp_span span = sample_span(em, md, b, s);
        int R = sample_len(em, b, s) - T, r0 = row0(md, em, b, s), Rj = plan_cp_held(&span, 0, R);
        if (Rj) be->copy(x0 + (size_t)r0 * d, enc_in + (size_t)vis * d, (size_t)Rj * d);
        vis += Rj;
        for (int i = 0; i < span.n; i++) {
            int a = span.lo[i] > R ? span.lo[i] : R, n = span.hi[i] - a;
            if (n <= 0) continue;
            float *xt = x0 + (size_t)(r0 + plan_cp_local(&span, a)) * d;
            if (vp) be->copy(xt, emb + (size_t)(md->sp <= 1 ? s * T + a - R : e) * d, (size_t)n * d);
            else be->embedding_forward(xt, md->w.wte, tokens + (size_t)s * T + a - R, n, d, 0, md->vocab_n);
            e += n;
        }
    }
    size_t Nl = (size_t)ex_norm_rows(md);
    if (md->seqpar) be->copy(ex_stage_input(md), x0 + (size_t)md->tp_rank * Nl * d, Nl * d);
}

/* The attention's sequences: each sample's rows (all of them under Ulysses,
 * whose attention sees every rank's). */
static void llm_sequences(const ex_model *em, ex_module *md, const ex_batch *b)
{
    bool all = plan_cp_of(&md->mm, &md->strat) == PLAN_CP_ULYSSES;
    md->cu[0] = 0;
    for (int s = 0; s < b->batch; s++) {
        plan_cp_span span = sample_span(em, md, b, s);
        md->cu[s + 1] = md->cu[s] + (all ? sample_len(em, b, s) : plan_cp_rows(&span));
    }
    md->n_seq = b->batch;
    ex_cu_upload(md, md->n_seq, -1);
}

/* The embedding's backward from dL/d(x0) of this rank's rows: the encoder
 * rows' gradient into dvis (sample after sample; returns how many rows), the
 * text rows' into this rank's vocabulary rows. */
static int llm_embed_backward(ex_model *em, ex_module *md, const ex_batch *b, const float *dx0)
{
    const ex_backend *be = em->be;
    const int32_t *tokens = md->slot[md->cur].tok_dev;   /* uploaded by the forward into this slot */
    int T = b->text_tokens, d = md->d, vis = 0;
    for (int s = 0; s < md->n_seq; s++) {
        plan_cp_span span = sample_span(em, md, b, s);
        int R = sample_len(em, b, s) - T, r0 = row0(md, em, b, s), Rj = plan_cp_held(&span, 0, R);
        if (Rj) be->copy(md->a.dvis + (size_t)vis * d, dx0 + (size_t)r0 * d, (size_t)Rj * d);
        vis += Rj;
        for (int i = 0; md->g.wte && i < span.n; i++) {
            int a = span.lo[i] > R ? span.lo[i] : R, n = span.hi[i] - a;
            if (n > 0)
                be->embedding_backward(md->g.wte, dx0 + (size_t)(r0 + plan_cp_local(&span, a)) * d,
                                       tokens + (size_t)s * T + a - R, n, d, md->vocab0, md->vocab_n);
        }
    }
    return vis;
}

/* Vocab-parallel cross-entropy over logits[Np, vocab_n] (this rank's vocab
 * columns): global row max (allreduce_max), then sum-exp and target logit
 * (one allreduce_sum of [2 Np]); loss_r = max + log(sum) - target logit.
 * With backward, dlogits = dscale (softmax - onehot) on the local columns
 * (no collective). Returns the sum of the rows' losses. */
static double llm_cross_entropy(ex_model *em, ex_module *md, bool backward, float dscale)
{
    const ex_backend *be = em->be;
    ex_acts *a = &md->a;
    int Np = em->n_pred, V = md->vocab_n;
    be->ce_row_max(a->ce_mx, a->logits, Np, V);
    ex_tp_allreduce_max(md, a->ce_mx, (size_t)Np);
    be->ce_exp_sum(backward ? a->dlogits : NULL, a->ce_st, a->logits, a->ce_mx, em->targets_dev, Np, V, md->vocab0);
    ex_tp_allreduce_f32(md, a->ce_st, (size_t)2 * Np);
    float *mx = em->host_ce, *st = em->host_ce + Np;   /* the rows' statistics, read on the host */
    be->d2h(mx, a->ce_mx, (size_t)Np * sizeof *mx);
    be->d2h(st, a->ce_st, (size_t)2 * Np * sizeof *st);
    double total = 0;
    for (int i = 0; i < Np; i++) total += mx[i] + log((double)st[i]) - st[Np + i];
    if (backward) be->ce_grad(a->dlogits, a->ce_st, em->targets_dev, Np, V, md->vocab0, dscale);
    return total;
}

/* The head's units: its own, and the stem's embedding when the head is tied
 * to it on the same stage (a pipeline's last stage holds a copy in its own unit). */
static bool head_uses_stem(const ex_module *md) { return md->mm.tied_embeddings && md->stage.stem; }

static void head_begin(ex_module *md, ex_unit_use use)
{
    ex_unit_begin(md, md->mm.layers + 1, use);
    if (head_uses_stem(md)) ex_unit_begin(md, 0, use);
}

static void head_end(ex_module *md, ex_unit_use use)
{
    ex_unit_end(md, md->mm.layers + 1, use, use == EX_USE_BACKWARD);
    if (head_uses_stem(md)) ex_unit_end(md, 0, use, false);
}

/* The rows and targets the loss counts (held_predictions). */
static int collect_predictions(ex_model *em, ex_module *md, const ex_batch *b, int Np, char *err)
{
    const ex_backend *be = em->be;
    if (Np > em->targets_cap) {
        util_free(em->targets);
        util_free(em->pred_rows);
        util_free(em->host_ce);
        be->release(em->targets_dev);
        be->release(em->pred_rows_dev);
        em->targets = util_malloc((size_t)Np * sizeof(int32_t));
        em->pred_rows = util_malloc((size_t)Np * sizeof(int));
        em->host_ce = util_malloc((size_t)3 * Np * sizeof(float));
        em->targets_dev = be->alloc((size_t)Np * sizeof(int32_t), UTIL_MEM_OTHER);
        em->pred_rows_dev = be->alloc((size_t)Np * sizeof(int), UTIL_MEM_OTHER);
        em->targets_cap = em->targets && em->pred_rows && em->host_ce && em->targets_dev && em->pred_rows_dev ? Np : 0;
        if (!em->targets_cap) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    }
    em->n_pred = held_predictions(em, md, b, em->pred_rows, em->targets);
    be->h2d(em->targets_dev, em->targets, (size_t)em->n_pred * sizeof(int32_t));
    be->h2d(em->pred_rows_dev, em->pred_rows, (size_t)em->n_pred * sizeof(int));
    return UTIL_OK;
}

/* This rank's rows of the batch (its sp share; its tp share under sequence parallelism). */
int ex_llm_rows(const ex_model *em, const ex_module *md, const ex_batch *b)
{
    int N = 0;
    for (int s = 0; s < b->batch; s++) N += sample_len(em, b, s);
    N /= md->sp;
    return md->seqpar ? N / md->tp : N;
}

/* Under context parallelism the samples share one length, which the
 * variant's chunks divide (plan_cp_check says so for a plan). */
static int check_context_parallel(const ex_model *em, const ex_module *md, const ex_batch *b, char *err)
{
    if (md->sp <= 1) return UTIL_OK;
    int S = sample_len(em, b, 0);
    plan_cp k = plan_cp_of(&md->mm, &md->strat);
    for (int s = 1; s < b->batch; s++)
        if (sample_len(em, b, s) != S)
            return util_fail(err, UTIL_EINVAL, "executor: batch: sample %d has %d positions, sample 0 %d: context parallelism (sp %d) needs one length", s, sample_len(em, b, s), S, md->sp);
    if (S % plan_cp_chunks(k, md->sp))
        return util_fail(err, UTIL_EINVAL, "executor: batch: %d positions per sample do not split into the %d chunks of %s context parallelism (sp %d)", S, plan_cp_chunks(k, md->sp), plan_cp_name(k), md->sp);
    return UTIL_OK;
}

/* The head's forward over the Np counted predicting rows of the final
 * hidden states (gathered in one call): final rmsnorm, logits[Np, V] =
 * head(.), loss = sum CE(logits, next text token) / denominator
 * (loss_denominator, or Np when it is 0; 0 if Np is 0). Its units are entered whatever Np is: a ZeRO-3
 * gather is collective. */
static void llm_head_forward(ex_model *em, ex_module *md, const ex_batch *b, bool backward, float *loss)
{
    const ex_backend *be = em->be;
    ex_acts *a = &md->a;
    int d = md->d, Np = em->n_pred;
    head_begin(md, EX_USE_FORWARD);
    const float *final = a->x_final;
    if (md->seqpar) {
        ex_tp_allgather(md, a->x_final, a->tp_full, (size_t)ex_norm_rows(md) * d);
        final = a->tp_full;
    }
    if (Np > 0) {
        be->gather_rows(a->xg, final, em->pred_rows_dev, Np, d);
        be->rmsnorm_forward(a->gath, a->rstdf, a->xg, md->w.lnf, Np, d, (float)model_norm_eps(&md->mm));
        be->linear_forward(a->logits, a->gath, md->w.head, NULL, Np, d, md->vocab_n);
        double den = b->loss_denominator > 0 ? b->loss_denominator : (double)Np;
        *loss = (float)(llm_cross_entropy(em, md, backward, (float)(1.0 / den)) / den);
    }
    head_end(md, EX_USE_FORWARD);
}

/* A per-sample count (images or clips) of the batch against its total. */
static int check_per_sample(const ex_batch *b, const int *per, int total, const char *field, const char *what, char *err)
{
    int sum = 0;
    for (int s = 0; s < b->batch; s++) {
        if (per[s] < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: %s[%d] < 0", field, s);
        sum += per[s];
    }
    if (sum != total) return util_fail(err, UTIL_EINVAL, "executor: batch: %s sums to %d, %s is %d", field, sum, what, total);
    return UTIL_OK;
}

static int check_text(const ex_model *em, const ex_batch *b, char *err)
{
    const model_module *llm = &em->m.mod[em->m.llm];
    if (b->batch <= 0 || b->text_tokens < 2 || !b->tokens)
        return util_fail(err, UTIL_EINVAL, "executor: batch: needs batch > 0, text_tokens >= 2 and tokens");
    for (int64_t i = 0; i < (int64_t)b->batch * b->text_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= llm->vocab)
            return util_fail(err, UTIL_EINVAL, "executor: batch: tokens[%lld] = %d outside vocab %d", (long long)i, (int)b->tokens[i], llm->vocab);
    if (!(b->loss_denominator >= 0) || !isfinite(b->loss_denominator))
        return util_fail(err, UTIL_EINVAL, "executor: batch: loss_denominator %g must be finite and >= 0", b->loss_denominator);
    int rc = ex_check_images(em, b, err);
    if (!rc) rc = ex_check_audio(em, b, err);
    if (!rc && b->n_images > 0) rc = check_per_sample(b, b->images_per_sample, b->n_images, "images_per_sample", "n_images", err);
    if (!rc && b->n_audio > 0) rc = check_per_sample(b, b->audio_per_sample, b->n_audio, "audio_per_sample", "n_audio", err);
    return rc;
}

/* LLM forward of this stage: on the first stage x0 = [the encoders' rows
 * of sample b (its images' merged tokens, its clips' pooled frames:
 * plan_sample_offset's order), wte[text tokens]] per sample (enc_in), on
 * the others the previous stage's rows; the stage's causal blocks; on the
 * last stage the head and the loss. */
int ex_llm_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    const ex_backend *be = em->be;
    int rc = check_text(em, b, err);
    if (rc) return rc;
    if (md->stage.stem && (b->n_images > 0 || b->n_audio > 0) && !io->enc_in)
        return util_fail(err, UTIL_EINVAL, "executor: %s forward: batch has images or audio but no encoder rows", md->mm.name);
    if (!md->stage.stem && !io->in)
        return util_fail(err, UTIL_EINVAL, "executor: %s stage %d forward: no input rows", md->mm.name, md->stage_index);
    if ((rc = check_context_parallel(em, md, b, err))) return rc;
    int T = b->text_tokens, B = b->batch, N = 0, E = 0;
    int Np = held_predictions(em, md, b, NULL, NULL);
    for (int s = 0; s < B; s++) {
        N += sample_len(em, b, s);
        E += encoder_rows(em, b, s);
    }
    N /= md->sp;
    if (md->seqpar && N % md->tp)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: %d rows do not split over the %d ranks of sequence parallelism", md->mm.name, N, md->tp);
    /* the slot as plan_llm_act_rows sizes it under context parallelism; else every text position's prediction */
    plan_act_rows want = { .rows = N, .merged_rows = E, .pred_rows = B * (T - 1), .emb_rows = md->tp > 1 ? B * T : 0 };
    if (md->sp > 1) want = plan_llm_act_rows(&md->mm, &md->strat, B, sample_len(em, b, 0), T);
    rc = ex_acts_ensure(md, N, want.merged_rows, Np, want.pred_rows, want.emb_rows, B, err);
    if (rc) return rc;
    md->comm_rc = 0;
    llm_sequences(em, md, b);
    if (md->stage.stem && !ex_slot_input(md, b->tokens, (size_t)B * T * sizeof(int32_t), true, err)) return UTIL_ENOMEM;
    if (md->stage.stem) {
        ex_unit_begin(md, 0, EX_USE_FORWARD);
        llm_embed(em, md, b, io->enc_in);
        ex_unit_end(md, 0, EX_USE_FORWARD, false);
    } else {
        be->copy(ex_stage_input(md), io->in, (size_t)ex_norm_rows(md) * md->d);
    }
    rc = llm_rope_tables(em, md, b, err);
    if (rc) return rc;
    ex_blocks_forward(be, md, md->cu_dev, md->cu_dev, true);
    io->loss = 0;
    io->out = md->a.x_final;
    io->out_rows = ex_norm_rows(md);
    if (md->stage.head) {
        if ((rc = collect_predictions(em, md, b, Np, err))) return rc;
        llm_head_forward(em, md, b, io->backward, &io->loss);
        io->out = NULL;
        io->out_rows = 0;
    }
    ex_slot_filled(md);
    if (md->comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: %s %s failed with %d", md->mm.name, ex_comm_what(md), md->comm_rc);
    if (!isfinite(io->loss)) return util_fail(err, UTIL_ERUNTIME, "executor: loss is %g", (double)io->loss);
    return UTIL_OK;
}

/* LLM backward of this stage: on the last stage from dlogits (the head's
 * input gradient summed over the tp group, vocab-parallel), else from the
 * next stage's gradient of this stage's rows; the blocks; on the first stage
 * the embedding's gradient (this rank's vocabulary rows) and dL/d(encoder
 * rows) into a->dvis (enc_in's layout), else the gradient of the stage's
 * input rows. Under sequence parallelism the head's and the embedding's
 * rows are all N rows: the blocks get this rank's slice, and their input
 * gradient is gathered. */
int ex_llm_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    const ex_backend *be = em->be;
    if (!md->slot[md->cur].filled)
        return util_fail(err, UTIL_EINVAL, "executor: %s backward: slot %d holds no forward", md->mm.name, md->cur);
    ex_slot_bind(md);
    if (!md->stage.head && !io->in)
        return util_fail(err, UTIL_EINVAL, "executor: %s stage %d backward: no output gradient", md->mm.name, md->stage_index);
    ex_acts *a = &md->a;
    int d = md->d, N = md->n_rows, Nl = ex_norm_rows(md), Np = em->n_pred;
    md->comm_rc = 0;
    if (md->stage.head) {
        float *dfull = md->seqpar ? a->tp_dfull : a->dres;   /* dL/d(final hidden) of all N rows */
        head_begin(md, EX_USE_BACKWARD);
        be->zero(dfull, (size_t)N * d);
        if (Np > 0) {
            be->zero(a->dgath, (size_t)Np * d);
            be->linear_backward(a->dgath, md->g.head, NULL, a->dlogits, a->gath, md->w.head, Np, d, md->vocab_n);
            ex_tp_allreduce(md, a->dgath, (size_t)Np * d);
            be->zero(a->dxg, (size_t)Np * d);
            be->rmsnorm_backward(a->dxg, md->g.lnf, a->dgath, a->xg, md->w.lnf, a->rstdf, Np, d);
            be->scatter_add_rows(dfull, a->dxg, em->pred_rows_dev, Np, d);
        }
        head_end(md, EX_USE_BACKWARD);
        if (md->seqpar) be->copy(a->dres, dfull + (size_t)md->tp_rank * Nl * d, (size_t)Nl * d);
    } else {
        be->copy(a->dres, io->in, (size_t)Nl * d);
    }
    ex_blocks_backward(be, md, md->cu_dev, md->cu_dev, true);
    io->out = a->dres;
    io->out_rows = Nl;
    if (md->stage.stem) {
        if (md->seqpar) ex_tp_allgather(md, a->dres, a->tp_dfull, (size_t)Nl * d);
        ex_unit_begin(md, 0, EX_USE_BACKWARD);
        int vis_rows = llm_embed_backward(em, md, b, md->seqpar ? a->tp_dfull : a->dres);
        ex_unit_end(md, 0, EX_USE_BACKWARD, true);
        io->out = a->dvis;
        io->out_rows = vis_rows;
    }
    if (md->comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: %s %s failed with %d", md->mm.name, ex_comm_what(md), md->comm_rc);
    return UTIL_OK;
}

int ex_llm_forward_backward(ex_model *em, const ex_batch *b, const float *enc_in, bool backward,
                            float *loss, const float **denc, char *err)
{
    ex_module *md = llm_of(em);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: ex_llm_forward_backward: no LLM module on this model instance");
    ex_stage_io io = { .enc_in = enc_in, .backward = backward };
    int rc = ex_llm_stage_forward(em, md, b, &io, err);
    if (rc) return rc;
    *loss = io.loss;
    ex_stage_io back = { 0 };
    if (backward && (rc = ex_llm_stage_backward(em, md, b, &back, err))) return rc;
    if (denc) *denc = backward ? back.out : NULL;
    return UTIL_OK;
}

/* A micro-batch this rank has no samples of, while its shard group's other
 * ranks do: only the unit hooks of a forward (and backward) (ex_stage_empty_pass). */
int ex_llm_empty_pass(ex_model *em, bool backward, char *err)
{
    int rc = ex_stage_empty_pass(em, em->m.llm, EX_USE_FORWARD, err);
    return rc || !backward ? rc : ex_stage_empty_pass(em, em->m.llm, EX_USE_BACKWARD, err);
}

/* The whole step's encoder rows between the encoders' outputs (each its
 * rows sample after sample: out[k]) and the LLM's input (each sample's
 * encoders in plan_sample_offset's order, an image's tokens in raster
 * order: enc); back (to_llm false), the LLM's gradient of them into grad[k]. */
static int shuffle_rows(const ex_model *em, const ex_batch *b, const float *const *out, float *const *grad, float *enc,
                        bool to_llm, char *err)
{
    int d = em->m.mod[em->m.llm].hidden;
    int k_of[2] = { em->vis_index, em->aud_index }, taken[2] = { 0, 0 }, at = 0, mpi = 0, *raster = NULL;
    if (em->vis_index >= 0 && b->n_images > 0) {
        const model_module *v = &em->m.mod[em->vis_index];
        mpi = ex_merged_per_image(em, b);
        if (!model_merged_order_is_raster(v, b->grid_w)) {
            if (!(raster = util_malloc((size_t)mpi * sizeof *raster))) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
            int rc = model_merged_raster(v, b->grid_h, b->grid_w, raster, err);
            if (rc) { util_free(raster); return rc; }
        }
    }
    for (int s = 0; s < b->batch; s++) {
        int rows[MODEL_MAX_MODULES] = { 0 };
        if (em->vis_index >= 0 && b->n_images > 0) rows[em->vis_index] = b->images_per_sample[s] * mpi;
        if (em->aud_index >= 0 && b->n_audio > 0) rows[em->aud_index] = b->audio_per_sample[s] * ex_audio_rows_per_clip(em, b);
        for (int e = 0; e < 2; e++) {
            int k = k_of[e];
            if (k < 0 || rows[k] == 0) continue;
            float *llm = enc + (size_t)(at + plan_sample_offset(&em->m, rows, k)) * d;
            float *own = (to_llm ? (float *)out[e] : grad[e]) + (size_t)taken[e] * d;
            ex_move_permuted_rows(em->be, own, llm, (size_t)rows[k], (size_t)d, e == 0 ? raster : NULL, (size_t)mpi, to_llm);
            taken[e] += rows[k];
        }
        at += plan_sample_offset(&em->m, rows, em->m.n_modules);
    }
    util_free(raster);
    return UTIL_OK;
}

int ex_encoder_rows_to_llm(const ex_model *em, const ex_batch *b, const float *const out[2], float *enc, char *err)
{
    return shuffle_rows(em, b, out, NULL, enc, true, err);
}

int ex_encoder_rows_from_llm(const ex_model *em, const ex_batch *b, const float *denc, float *const grad[2], char *err)
{
    return shuffle_rows(em, b, NULL, grad, (float *)denc, false, err);
}

static int step(ex_model *em, const ex_batch *b, bool backward, float *loss, char *err)
{
    ex_module *vis = em->vis_index >= 0 ? ex_module_at(em, em->vis_index) : NULL;
    ex_module *aud = em->aud_index >= 0 ? ex_module_at(em, em->aud_index) : NULL;
    if (!llm_of(em) || (em->vis_index >= 0 && !vis) || (em->aud_index >= 0 && !aud) || (vis && vis->sp > 1) ||
        (aud && aud->sp > 1) || llm_of(em)->sp > 1)
        return util_fail(err, UTIL_EINVAL, "executor: a whole step needs every module on this instance and no sequence parallelism (use the module-level calls)");
    int rc = check_text(em, b, err);
    if (rc) return rc;
    int d = llm_of(em)->d, rows[2] = { 0, 0 };
    const float *out[2] = { NULL, NULL }, *denc = NULL;
    if (b->n_images > 0 && (rc = ex_vision_forward(em, b, &out[0], &rows[0], err))) return rc;
    if (b->n_audio > 0 && (rc = ex_audio_forward(em, b, &out[1], &rows[1], err))) return rc;
    size_t all = (size_t)(rows[0] + rows[1]) * d;
    const ex_backend *be = em->be;
    float *enc = be->alloc((all ? all : 1) * sizeof(float), UTIL_MEM_OTHER), *grad[2] = { NULL, NULL };
    grad[0] = be->alloc(((size_t)rows[0] * d + 1) * sizeof(float), UTIL_MEM_OTHER);
    grad[1] = be->alloc(((size_t)rows[1] * d + 1) * sizeof(float), UTIL_MEM_OTHER);
    if (!enc || !grad[0] || !grad[1]) rc = util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    if (!rc) rc = ex_encoder_rows_to_llm(em, b, out, enc, err);
    if (!rc) rc = ex_llm_forward_backward(em, b, all ? enc : NULL, backward, loss, &denc, err);
    if (!rc && backward && all) {
        rc = ex_encoder_rows_from_llm(em, b, denc, grad, err);
        if (!rc && b->n_images > 0) rc = ex_vision_backward(em, b, grad[0], err);
        if (!rc && b->n_audio > 0) rc = ex_audio_backward(em, b, grad[1], err);
    }
    be->release(enc); be->release(grad[0]); be->release(grad[1]);
    return rc;
}

int ex_step_forward_backward(ex_model *em, const ex_batch *b, float *loss, char *err)
{
    return step(em, b, true, loss, err);
}

int ex_step_forward(ex_model *em, const ex_batch *b, float *loss, char *err)
{
    return step(em, b, false, loss, err);
}
