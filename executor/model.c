/* The model's parameters: layout (from plan_module_tensors, so the memory
 * model describes exactly this), deterministic init, units and the views the
 * data-parallel strategies bind (ZeRO shard state and the parameter API are
 * in model_params.c).
 * Architecture reference: Hugging Face transformers
 * src/transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py (vision blocks,
 * VisionRotaryEmbedding, PatchMerger) and models/qwen2/modeling_qwen2.py (LLM).
 * The computation is in block.c, vision.c, llm.c and optimizer.c. */
#include "executor/model_int.h"
#include "executor/precision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- layout */

/* The weight view a tensor of this role (and layer) sets. */
static float **view_of(ex_weights *W, plan_tensor_role role, int layer)
{
    ex_block_w *b = layer >= 0 ? &W->blk[layer] : NULL;
    switch (role) {
    case PLAN_TW_PATCH_W: return &W->patch_w;
    case PLAN_TW_PATCH_B: return &W->patch_b;
    case PLAN_TW_WTE: return &W->wte;
    case PLAN_TW_LN1: return &b->ln1;
    case PLAN_TW_WQ: return &b->wq;
    case PLAN_TW_BQ: return &b->bq;
    case PLAN_TW_WK: return &b->wk;
    case PLAN_TW_BK: return &b->bk;
    case PLAN_TW_WV: return &b->wv;
    case PLAN_TW_BV: return &b->bv;
    case PLAN_TW_WO: return &b->wo;
    case PLAN_TW_BO: return &b->bo;
    case PLAN_TW_LN2: return &b->ln2;
    case PLAN_TW_WG: return &b->wg;
    case PLAN_TW_BG: return &b->bg;
    case PLAN_TW_WU: return &b->wu;
    case PLAN_TW_BU: return &b->bu;
    case PLAN_TW_WD: return &b->wd;
    case PLAN_TW_BD: return &b->bd;
    case PLAN_TW_MERGE_LN: return &W->merge_ln;
    case PLAN_TW_M0W: return &W->m0w;
    case PLAN_TW_M0B: return &W->m0b;
    case PLAN_TW_M2W: return &W->m2w;
    case PLAN_TW_M2B: return &W->m2b;
    case PLAN_TW_LNF: return &W->lnf;
    case PLAN_TW_HEAD: return &W->head;
    case PLAN_TW_LN1_B: return &b->ln1b;
    case PLAN_TW_LN2_B: return &b->ln2b;
    case PLAN_TW_LNF_B: return &W->lnf_b;
    case PLAN_TW_CONV1_W: return &W->conv1w;
    case PLAN_TW_CONV1_B: return &W->conv1b;
    case PLAN_TW_CONV2_W: return &W->conv2w;
    case PLAN_TW_CONV2_B: return &W->conv2b;
    case PLAN_TW_POS: return &W->pos;
    case PLAN_TW_PROJ_W: return &W->proj_w;
    case PLAN_TW_PROJ_B: return &W->proj_b;
    case PLAN_TW_CLS: return &W->cls;
    case PLAN_TW_PRE_LN: return &W->pre_ln;
    case PLAN_TW_PRE_LN_B: return &W->pre_ln_b;
    default: return NULL;
    }
}

static int layout(ex_module *md, char *err)
{
    const model_module *mm = &md->mm;
    int n = plan_module_tensors(mm, md->tp, md->tp_rank, md->seqpar, &md->held, NULL, 0);
    plan_tensor *pt = util_malloc((size_t)n * sizeof *pt);
    md->t = util_calloc((size_t)n, sizeof *md->t);
    md->n_units = plan_module_units(mm);
    md->unit_off = util_calloc((size_t)md->n_units + 1, sizeof *md->unit_off);
    if (!pt || !md->t || !md->unit_off) {
        util_free(pt);
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the tensor table", mm->name);
    }
    plan_module_tensors(mm, md->tp, md->tp_rank, md->seqpar, &md->held, pt, n);
    md->n_tensors = n;
    for (int i = 0; i < n; i++) {
        ex_tensor *t = &md->t[i];
        t->d = pt[i];
        snprintf(t->name, sizeof t->name, "%s.%s", mm->name, pt[i].name);
        t->off = md->n_params;
        t->numel = (size_t)(pt[i].shape[0] * pt[i].shape[1]);
        t->pslot = pt[i].unused ? NULL : view_of(&md->w, pt[i].role, pt[i].layer);   /* never read: no view */
        t->gslot = pt[i].unused ? NULL : view_of(&md->g, pt[i].role, pt[i].layer);
        md->n_params += t->numel;
        md->unit_off[pt[i].unit + 1] = md->n_params;
    }
    for (int u = 1; u <= md->n_units; u++)
        if (md->unit_off[u] < md->unit_off[u - 1]) md->unit_off[u] = md->unit_off[u - 1];
    util_free(pt);
    return UTIL_OK;
}

/* The tied LLM head reads the embedding's views (where one stage holds both;
 * a pipeline's last stage holds a copy of its own, plan_tensor.tied_copy). */
static void tie_head(ex_module *md)
{
    if (md->mm.kind != MODEL_LLM || !md->mm.tied_embeddings || !md->held.stem) return;
    md->w.head = md->w.wte;
    md->g.head = md->g.wte;
}

/* Points a tensor's view of one kind at base + its offset inside its unit
 * (base NULL: at the flat buffer, or NULL if there is none). */
static void bind_tensor(ex_module *md, const ex_tensor *t, int kind, float *base)
{
    float *flat = kind == EX_BUF_PARAMS ? md->params : md->grads;
    float **slot = kind == EX_BUF_PARAMS ? t->pslot : t->gslot;
    if (!slot) return;
    size_t unit0 = md->unit_off[t->d.unit];
    *slot = base ? base + (t->off - unit0) : flat ? flat + t->off : NULL;
}

void ex_module_bind_all(ex_module *md, int kind)
{
    for (int i = 0; i < md->n_tensors; i++) bind_tensor(md, &md->t[i], kind, NULL);
    tie_head(md);
}

/* ------------------------------------------------------------------ init */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Element j of a tensor's N(0, 1) stream: Box-Muller over the 53-bit uniforms
 * of splitmix64 outputs 2j and 2j+1 from state s0 (stateless, so any shard
 * draws exactly its slice of the full tensor). */
static double rng_normal_at(uint64_t s0, uint64_t j)
{
    uint64_t a = s0 + 2 * j * 0x9E3779B97F4A7C15ull, b = a + 0x9E3779B97F4A7C15ull;
    double u1 = ((splitmix64(&a) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = ((splitmix64(&b) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Each tensor drawn on the host, then copied to the backend's buffer. */
static int init_module(ex_module *md, uint64_t seed, char *err)
{
    size_t most = 0;
    for (int i = 0; i < md->n_tensors; i++) most = md->t[i].numel > most ? md->t[i].numel : most;
    float *p = util_malloc((most ? most : 1) * sizeof *p);
    if (!p) return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the initial weights", md->mm.name);
    for (int i = 0; i < md->n_tensors; i++) {
        const ex_tensor *t = &md->t[i];
        const plan_tensor *d = &t->d;
        if (d->init_std == 0) {
            for (size_t j = 0; j < t->numel; j++) p[j] = d->init_const;
        } else {
            uint64_t s0 = seed ^ fnv1a64(t->name);
            for (int64_t r = 0; r < d->shape[0]; r++)
                for (int64_t c = 0; c < d->shape[1]; c++) {
                    uint64_t j = (uint64_t)((d->start[0] + r) * d->full[1] + d->start[1] + c);
                    p[r * d->shape[1] + c] = (float)(d->init_std * rng_normal_at(s0, j));
                }
        }
        md->be->h2d(md->params + t->off, p, t->numel * sizeof *p);
    }
    util_free(p);
    return UTIL_OK;
}

/* -------------------------------------------------------------- validate */

static int check_common(const model_module *mm, char *err)
{
    const char *n = mm->name;
    if (mm->layers <= 0 || mm->hidden <= 0 || mm->heads <= 0 || mm->kv_heads <= 0 ||
        mm->head_dim <= 0 || mm->ffn <= 0)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: layers, hidden, heads, kv_heads, head_dim, ffn must be > 0", n);
    if (mm->heads % mm->kv_heads)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: kv_heads %d does not divide heads %d", n, mm->kv_heads, mm->heads);
    /* 2-D rotary splits head_dim / 2 pairs in two; no rotary (audio): any width */
    int rot = !plan_module_rotary(mm) ? 1 : mm->kind == MODEL_VISION ? 4 : 2;
    if (mm->head_dim % rot || mm->head_dim > EX_MAX_HEAD_DIM)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: head_dim %d must be a multiple of %d and <= %d", n, mm->head_dim, rot, EX_MAX_HEAD_DIM);
    /* The blocks run RMSNorm or LayerNorm, SwiGLU or GELU MLPs (block.c); the
     * LLM's head and the vision merger are RMSNorm models (llm.c, vision.c). */
    bool abs_pos = mm->kind == MODEL_AUDIO || plan_module_clip(mm);   /* audio.c, clip.c */
    if (!abs_pos && mm->norm != MODEL_NORM_RMSNORM)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: layernorm is implemented for the audio encoder and a CLIP tower (cls_token) only", n);
    if (mm->qk_norm || mm->layer_scale || mm->n_cross_layers || mm->gated_layers ||
        (mm->max_positions && !abs_pos) || mm->qk_norm_head || mm->post_norms || mm->extra_params)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: qk norms, post norms, layer_scale, cross layers, gated layers, learned positions outside an audio encoder or a CLIP tower and extra parameters are not implemented", n);
    if (mm->unfused_attention || mm->dropout)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: unfused_attention and dropout are priced, not run (FlashAttention-style attention, no dropout)", n);
    return UTIL_OK;
}

static int check_vision(const model_module *mm, const model_module *llm, char *err)
{
    const char *n = mm->name;
    if (plan_module_clip(mm)) return ex_check_clip_module(mm, llm, err);
    int m = mm->merge;
    if (mm->in_channels <= 0 || mm->patch <= 0 || mm->temporal_patch <= 0 || m <= 0)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: in_channels, patch, temporal_patch, merge must be > 0", n);
    if (mm->proj_hidden <= 0)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: proj_hidden 0 (single linear projector) is not implemented", n);
    if (mm->proj_in != mm->hidden * m * m)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: proj_in %d != hidden %d * merge^2", n, mm->proj_in, mm->hidden);
    if (mm->out_hidden != llm->hidden)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: out_hidden %d != llm hidden %d", n, mm->out_hidden, llm->hidden);
    if (!mm->proj_norm)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: merger without proj_norm is not implemented", n);
    if (mm->window > 0) {
        int side = (int)lround(sqrt((double)mm->window));
        if (side * side != mm->window || side % m)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: window %d is not a square of a multiple of merge %d", n, mm->window, m);
    }
    return UTIL_OK;
}

/* Checks one module's parallel layout: tp over heads / kv heads / ffn (and the
 * vocabulary for the LLM), sp over heads of the local tp shard (Ulysses) or
 * over the ring (the LLM's ring attention, plan_cp_of), Megatron sequence
 * parallelism (the LLM only, with its collectives). */
static int check_layout(const ex_module *md, const ex_parallel *par, char *err)
{
    const model_module *mm = &md->mm;
    const char *n = mm->name;
    plan_cp cp = plan_cp_of(mm, &md->strat);
    if (md->sp > 1 && (md->sp_rank < 0 || md->sp_rank >= md->sp))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: sp_rank %d outside sp_size %d", n, md->sp_rank, md->sp);
    if (cp == PLAN_CP_ULYSSES && !par->alltoall)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: Ulysses sequence parallelism needs alltoall", n);
    if (cp == PLAN_CP_RING && (!par->p2p_start || !par->p2p_wait))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: ring attention needs p2p_start and p2p_wait", n);
    if (md->tp > 1 && (md->tp_rank < 0 || md->tp_rank >= md->tp || !par->allreduce_sum))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_rank %d outside tp_size %d or no allreduce_sum", n, md->tp_rank, md->tp);
    int split = cp == PLAN_CP_RING ? md->tp : md->tp * md->sp;   /* ring attention keeps every head of the tp shard */
    if (mm->heads % split || mm->kv_heads % split)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_size %d x sp_size %d does not divide heads %d and kv_heads %d", n, md->tp, cp == PLAN_CP_RING ? 1 : md->sp, mm->heads, mm->kv_heads);
    if (mm->ffn % md->tp)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_size %d does not divide ffn %d", n, md->tp, mm->ffn);
    if (mm->kind == MODEL_LLM && md->tp > 1) {
        if (mm->vocab % md->tp)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: vocab %d is not a multiple of tp_size %d (vocab-parallel embedding and LM head; pad the vocabulary)", n, mm->vocab, md->tp);
        if (!par->allreduce_max)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_size %d needs allreduce_max (vocab-parallel cross-entropy)", n, md->tp);
    }
    if (md->seqpar && mm->kind != MODEL_LLM)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: Megatron sequence parallelism applies to the LLM only", n);
    if (par && par->pp_size > 1 && par->pp_size > mm->layers)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: %d pipeline stages for %d blocks", n, par->pp_size, mm->layers);
    if (md->seqpar && (!par->allgather || !par->reduce_scatter))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: sequence parallelism needs allgather and reduce_scatter", n);
    return ex_wire_check(md, par, err);
}

/* ---------------------------------------------------------------- create */

static void module_free(ex_module *md)
{
    const ex_backend *be = md->be;
    util_free(md->t);
    util_free(md->unit_off);
    ex_shard_free(&md->shard);
    util_free(md->w.blk);
    util_free(md->g.blk);
    util_free(md->a.blk);
    ex_precision_detach(md);
    if (be) {
        be->release(md->params);
        be->release(md->grads);
        be->release(md->m);
        be->release(md->v);
        be->release(md->pshard);
        be->release(md->gshard);
        ex_acts_free(md);
    }
    memset(md, 0, sizeof *md);
}

bool ex_module_trains(const ex_module *md) { return md->on && model_trains(&md->mm); }

/* A frozen module keeps its weights only: no gradients, no optimizer state. */
static int alloc_state(ex_module *md, char *err)
{
    bool trains = model_trains(&md->mm);
    size_t bytes = md->n_params * sizeof(float);
    md->params = md->be->alloc(bytes, UTIL_MEM_PARAMS);
    if (trains) {
        md->grads = md->be->alloc(bytes, UTIL_MEM_GRADS);
        md->m = md->be->alloc(bytes, UTIL_MEM_OPTIM);
        md->v = md->be->alloc(bytes, UTIL_MEM_OPTIM);
    }
    if (!md->params || (trains && (!md->grads || !md->m || !md->v)))
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for %zu parameters", md->mm.name, md->n_params);
    return ex_shard_init(&md->shard, md->unit_off, md->n_units, 1, 0, err);
}

static int module_create(ex_module *md, const ex_backend *be, const model_module *mm, int index, uint64_t seed,
                         const ex_parallel *par, char *err)
{
    memset(md, 0, sizeof *md);
    md->be = be;
    md->on = true;
    md->index = index;
    md->mm = *mm;
    md->tp = par && par->tp_size > 1 ? par->tp_size : 1;
    md->tp_rank = md->tp > 1 ? par->tp_rank : 0;
    if (par) md->par = *par;
    md->sp = par && par->sp_size > 1 ? par->sp_size : 1;
    md->sp_rank = md->sp > 1 ? par->sp_rank : 0;
    md->seqpar = par && par->seq_parallel && md->tp > 1;
    md->recompute = par ? par->recompute : PLAN_RECOMP_NONE;
    md->rope = plan_module_rotary(mm);
    if (md->recompute == PLAN_RECOMP_OP)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: recompute 'op' (torchtitan's per-op checkpointing) is priced, not run", mm->name);
    md->strat = (plan_module){ .dp = 1, .tp = md->tp, .sp = md->sp, .pp = 1, .micro_batch = 1,
                               .recompute = md->recompute, .recompute_layers = par ? par->recompute_layers : 0,
                               .seq_parallel = md->seqpar, .cp = par ? par->cp : PLAN_CP_NONE };
    if (par && par->pp_size > 1) {
        if (par->pp_size > PLAN_MAX_PP || par->pp_rank < 0 || par->pp_rank >= par->pp_size)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: pp_rank %d outside pp_size %d (at most %d)", mm->name,
                             par->pp_rank, par->pp_size, PLAN_MAX_PP);
        md->strat.pp = par->pp_size;
        md->strat.vp = par->vp;
        memcpy(md->strat.stage_layers, par->stage_layers, sizeof md->strat.stage_layers);
        md->strat.split_ends = par->split_ends;
        md->stage_index = par->pp_rank;
    }
    char why[UTIL_ERR_LEN];
    if (plan_stage_split_check(mm, &md->strat, why)) return util_fail(err, UTIL_EINVAL, "executor: module %s", why);
    md->held = plan_stage_of(mm, &md->strat, md->stage_index);
    md->stage = plan_stage_chunk(&md->held, 0);
    int rc = check_layout(md, par, err);
    if (rc) return rc;
    md->d = mm->hidden;
    md->H = mm->heads / md->tp;
    md->Hkv = mm->kv_heads / md->tp;
    md->hd = mm->head_dim;
    md->f = mm->ffn / md->tp;
    if (mm->kind == MODEL_LLM) {
        md->vocab_n = mm->vocab / md->tp;
        md->vocab0 = md->tp_rank * md->vocab_n;
    }
    md->w.blk = util_calloc((size_t)mm->layers, sizeof(ex_block_w));
    md->g.blk = util_calloc((size_t)mm->layers, sizeof(ex_block_w));
    md->a.blk = util_calloc((size_t)mm->layers, sizeof(ex_block_acts));
    if (!md->w.blk || !md->g.blk || !md->a.blk)
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory", mm->name);
    if ((rc = layout(md, err)) || (rc = alloc_state(md, err))) return rc;
    ex_module_bind_all(md, EX_BUF_PARAMS);
    ex_module_bind_all(md, EX_BUF_GRADS);
    return init_module(md, seed, err);
}

int ex_model_create(const model_t *m, uint64_t seed, ex_model **out, char *err)
{
    return ex_model_create_per_module(ex_backend_cpu(), m, seed, ~0u, NULL, out, err);
}

int ex_model_create_modules(const model_t *m, uint64_t seed, unsigned modules, ex_model **out,
                            char *err)
{
    return ex_model_create_per_module(ex_backend_cpu(), m, seed, modules, NULL, out, err);
}

/* One layout for the whole instance: its tp part goes to the LLM, its sp part
 * to the vision encoder. */
int ex_model_create_parallel(const model_t *m, uint64_t seed, unsigned modules,
                             const ex_parallel *par, ex_model **out, char *err)
{
    if (!par) return ex_model_create_per_module(ex_backend_cpu(), m, seed, modules, NULL, out, err);
    ex_parallel pm[MODEL_MAX_MODULES];
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        pm[k] = *par;
        if (k == m->llm) pm[k].sp_size = 1;
        else pm[k].tp_size = 1;
    }
    return ex_model_create_per_module(ex_backend_cpu(), m, seed, modules, pm, out, err);
}

int ex_model_create_per_module(const ex_backend *be, const model_t *m, uint64_t seed, unsigned modules,
                               const ex_parallel *par, ex_model **out, char *err)
{
    *out = NULL;
    if (!be || !be->alloc) return util_fail(err, UTIL_EINVAL, "executor: model %s: no backend", m->name);
    if (m->n_modules < 1 || m->n_modules > MODEL_MAX_MODULES)
        return util_fail(err, UTIL_EINVAL, "executor: model %s: %d modules", m->name, m->n_modules);
    if (m->llm < 0 || m->llm >= m->n_modules || m->mod[m->llm].kind != MODEL_LLM)
        return util_fail(err, UTIL_EINVAL, "executor: model %s: no LLM module", m->name);
    const model_module *llm = &m->mod[m->llm];
    int rc = check_common(llm, err);
    if (rc) return rc;
    if (llm->vocab <= 0) return util_fail(err, UTIL_EINVAL, "executor: module %s: vocab must be > 0", llm->name);
    int vis = -1, aud = -1;
    for (int i = 0; i < m->n_modules; i++) {
        if (i == m->llm) continue;
        int *slot = m->mod[i].kind == MODEL_VISION ? &vis : m->mod[i].kind == MODEL_AUDIO ? &aud : NULL;
        if (!slot || *slot >= 0)
            return util_fail(err, UTIL_EUNSUPPORTED, "executor: model %s: module %s: at most one vision and one audio encoder feed the LLM", m->name, m->mod[i].name);
        *slot = i;
    }
    if (vis >= 0) {
        if ((rc = check_common(&m->mod[vis], err)) || (rc = check_vision(&m->mod[vis], llm, err))) return rc;
    }
    if (aud >= 0) {
        if ((rc = check_common(&m->mod[aud], err)) || (rc = ex_check_audio_module(&m->mod[aud], llm, err))) return rc;
    }
    bool any = false;
    for (int k = 0; k < m->n_modules; k++) any |= (modules >> k & 1u) != 0;
    if (!any) return util_fail(err, UTIL_EINVAL, "executor: model %s: no module selected", m->name);
    ex_model *em = util_calloc(1, sizeof *em);
    if (!em) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    em->m = *m;
    em->be = be;
    em->vis_index = vis;
    em->aud_index = aud;
    for (int k = 0; !rc && k < m->n_modules; k++)
        if (modules >> k & 1u) rc = module_create(&em->mod[k], be, &m->mod[k], k, seed, par ? &par[k] : NULL, err);
    if (rc) { ex_model_free(em); return rc; }
    *out = em;
    return UTIL_OK;
}

void ex_model_free(ex_model *em)
{
    if (!em) return;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) module_free(&em->mod[k]);
    util_free(em->targets);
    util_free(em->pred_rows);
    em->be->release(em->targets_dev);
    em->be->release(em->pred_rows_dev);
    util_free(em->host_ce);
    util_free(em);
}

const ex_backend *ex_model_backend(const ex_model *em) { return em->be; }

ex_module *ex_module_at(ex_model *em, int module_index)
{
    if (module_index < 0 || module_index >= MODEL_MAX_MODULES || !em->mod[module_index].on) return NULL;
    return &em->mod[module_index];
}

/* ------------------------------------------------------- units and hooks */

int ex_model_set_unit_hooks(ex_model *em, int module_index, const ex_unit_hooks *h)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return UTIL_ENOTFOUND;
    if (h) md->hooks = *h;
    else memset(&md->hooks, 0, sizeof md->hooks);
    return UTIL_OK;
}

void ex_unit_begin(ex_module *md, int u, ex_unit_use use)
{
    if (!md->hooks.begin || md->comm_rc) return;
    md->comm_rc = md->hooks.begin(md->hooks.ctx, md->index, u, use);
}

void ex_unit_end(ex_module *md, int u, ex_unit_use use, bool last)
{
    if (!md->hooks.end || md->comm_rc) return;
    md->comm_rc = md->hooks.end(md->hooks.ctx, md->index, u, use, last);
}

/* The order vision.c and llm.c call the unit hooks in (llm.c's head_begin
 * enters the head, then the tied stem). */
int ex_module_unit_order(ex_model *em, int module_index, ex_unit_use use, int *order, int cap)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return 0;
    const plan_stage *st = &md->stage;
    int head = md->mm.layers + 1, n = 0;
    bool tied = md->mm.kind == MODEL_LLM && md->mm.tied_embeddings && st->stem && st->head;
#define PUT(u) do { if (n < cap) order[n] = (u); n++; } while (0)
    if (use == EX_USE_FORWARD) {
        if (st->stem) PUT(0);
        for (int l = st->first; l < st->first + st->count; l++) PUT(1 + l);
        if (st->head) PUT(head);
        if (tied) PUT(0);
    } else {
        if (st->head) PUT(head);
        if (tied) PUT(0);
        for (int l = st->first + st->count - 1; l >= st->first; l--) PUT(1 + l);
        if (st->stem) PUT(0);
    }
#undef PUT
    return n;
}

int ex_module_stage(ex_model *em, int module_index, plan_stage *st, bool *first, bool *last)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return UTIL_ENOTFOUND;
    if (st) *st = md->stage;
    if (first) *first = md->stage_index == 0;
    if (last) *last = md->stage_index == md->strat.pp * plan_vp(&md->strat) - 1;
    return UTIL_OK;
}

int ex_module_set_chunk(ex_model *em, int module_index, int chunk, char *err)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: module %d is not on this model instance", module_index);
    int vp = plan_vp(&md->strat), pp = md->strat.pp > 1 ? md->strat.pp : 1;
    if (chunk < 0 || chunk >= vp)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: model chunk %d outside 0..%d", md->mm.name, chunk, vp - 1);
    md->stage = plan_stage_chunk(&md->held, chunk);
    md->stage_index = chunk * pp + md->stage_index % pp;
    return UTIL_OK;
}

int ex_module_set_slot(ex_model *em, int module_index, int slot, char *err)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: module %d is not on this model instance", module_index);
    if (slot < 0 || slot >= EX_MAX_SLOTS)
        return util_fail(err, UTIL_EINVAL, "executor: slot %d outside 0..%d", slot, EX_MAX_SLOTS - 1);
    md->cur = slot;
    return UTIL_OK;
}

int ex_stage_rows(ex_model *em, int module_index, const ex_batch *b)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return 0;
    if (plan_module_clip(&md->mm)) return ex_clip_rows(md, b);
    return md->mm.kind == MODEL_LLM ? ex_llm_rows(em, md, b) : md->mm.kind == MODEL_AUDIO ? ex_audio_rows(md, b)
                                                                                        : ex_vision_rows(md, b);
}

float *ex_module_embedding_grad(ex_model *em, int module_index, size_t *n)
{
    ex_module *md = ex_module_at(em, module_index);
    *n = 0;
    if (!md || md->mm.kind != MODEL_LLM || !md->mm.tied_embeddings) return NULL;
    float *g = md->held.stem ? md->g.wte : md->held.head ? md->g.head : NULL;
    if (g) *n = (size_t)md->vocab_n * md->d;
    return g;
}

int ex_stage_forward(ex_model *em, int module_index, const ex_batch *b, ex_stage_io *io, char *err)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: module %d is not on this model instance", module_index);
    if (md->mm.kind == MODEL_AUDIO) return ex_audio_stage_forward(em, md, b, io, err);
    if (plan_module_clip(&md->mm)) return ex_clip_stage_forward(em, md, b, io, err);
    return md->mm.kind == MODEL_LLM ? ex_llm_stage_forward(em, md, b, io, err) : ex_vision_stage_forward(em, md, b, io, err);
}

int ex_stage_backward(ex_model *em, int module_index, const ex_batch *b, ex_stage_io *io, char *err)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: module %d is not on this model instance", module_index);
    if (md->mm.kind == MODEL_AUDIO) return ex_audio_stage_backward(em, md, b, io, err);
    if (plan_module_clip(&md->mm)) return ex_clip_stage_backward(em, md, b, io, err);
    return md->mm.kind == MODEL_LLM ? ex_llm_stage_backward(em, md, b, io, err) : ex_vision_stage_backward(em, md, b, io, err);
}

/* The unit hooks of a pass in the order ex_module_unit_order gives, each
 * begin closed by its end, the backward's last use of each unit flagged: as
 * the real passes call them (vision.c, llm.c; the unit-order test checks both). */
int ex_stage_empty_pass(ex_model *em, int module_index, ex_unit_use use, char *err)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: module %d is not on this model instance", module_index);
    bool back = use == EX_USE_BACKWARD;
    md->comm_rc = 0;
    if (back && !model_runs_backward(&md->mm)) return UTIL_OK;   /* a frozen encoder */
    int n = ex_module_unit_order(em, module_index, use, NULL, 0);
    int *seq = util_malloc((size_t)(n > 0 ? n : 1) * sizeof *seq);
    if (!seq) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    ex_module_unit_order(em, module_index, use, seq, n);
    /* a unit's hooks nest around the next ones where it is used with them: the tied head uses the stem inside it */
    bool tied = md->mm.kind == MODEL_LLM && md->mm.tied_embeddings && md->stage.stem && md->stage.head;
    int head = md->mm.layers + 1;
    for (int i = 0; i < n; i++) {
        int u = seq[i];
        bool paired = tied && u == head && i + 1 < n && seq[i + 1] == 0;
        ex_unit_begin(md, u, use);
        if (paired) {
            ex_unit_begin(md, 0, use);
            ex_unit_end(md, u, use, back);
            ex_unit_end(md, 0, use, false);
            i++;
            continue;
        }
        ex_unit_end(md, u, use, back);
    }
    util_free(seq);
    return md->comm_rc ? util_fail(err, UTIL_ERUNTIME, "executor: %s: an empty pass's collective failed with %d", md->mm.name,
                                   md->comm_rc)
                       : UTIL_OK;
}

int ex_module_units(ex_model *em, int module_index, const size_t **offsets, int *n_units)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return UTIL_ENOTFOUND;
    *offsets = md->unit_off;
    *n_units = md->n_units;
    return UTIL_OK;
}

int ex_unit_bind(ex_model *em, int module_index, int unit, int kind, float *base)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md || unit < 0 || unit >= md->n_units || (kind != EX_BUF_PARAMS && kind != EX_BUF_GRADS)) return UTIL_EINVAL;
    for (int i = 0; i < md->n_tensors; i++)
        if (md->t[i].d.unit == unit) bind_tensor(md, &md->t[i], kind, base);
    tie_head(md);
    return UTIL_OK;
}
