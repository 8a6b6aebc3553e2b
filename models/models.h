/* models: multimodal model descriptions (our JSON schema "dhp.model/1"),
 * the built-in zoo, parameter counting and the Hugging Face config importer.
 *
 * A model is a small graph of modules: zero or more encoders (vision ViT,
 * audio encoder), each with its merger/projector, feeding one decoder LLM.
 * All sizes are integers as published in each model's config.json. */
#ifndef DHP_MODELS_H
#define DHP_MODELS_H

#include <stdbool.h>
#include <stdint.h>
#include "util/util.h"

#define MODEL_MAX_MODULES 4
#define MODEL_MAX_LIST 64
#define MODEL_NAME_LEN 64
#define MODEL_SCHEMA "dhp.model/1"
/* Validation limits: keep every parameter count well inside int64. */
#define MODEL_MAX_WIDTH (1 << 20)    /* hidden, ffn, heads*head_dim, vocab, positions, projector widths */
#define MODEL_MAX_NORM_EPS 0.01      /* a norm epsilon above this is a mistake, not a model */
#define MODEL_MAX_LAYERS (1 << 17)
#define MODEL_MAX_FACTOR 1024        /* in_channels, patch, temporal_patch, merge, pool, tiles, aspect ratios */

typedef enum { MODEL_VISION = 0, MODEL_AUDIO, MODEL_LLM } model_kind;
/* GELU: fc1, erf-GELU, fc2. QUICK_GELU: the same with CLIP's x * sigmoid(1.702 x)
 * (hidden_act "quick_gelu"). Both are "a GELU MLP" wherever only the shape matters. */
typedef enum { MODEL_FFN_GELU = 0, MODEL_FFN_SWIGLU, MODEL_FFN_QUICK_GELU } model_ffn_kind;
typedef enum { MODEL_NORM_LAYERNORM = 0, MODEL_NORM_RMSNORM } model_norm_kind;

typedef struct {
    char name[MODEL_NAME_LEN];   /* "vision", "audio", "llm" */
    model_kind kind;
    int layers;                  /* transformer blocks (LLM: self-attention blocks + cross blocks) */
    int hidden;                  /* model width d */
    int heads;                   /* query heads */
    int kv_heads;                /* key/value heads (GQA); == heads for MHA */
    int head_dim;                /* usually hidden / heads; some models differ */
    int ffn;                     /* MLP intermediate size */
    model_ffn_kind ffn_kind;     /* GELU: up,down. SwiGLU: gate,up,down */
    model_norm_kind norm;
    bool qkv_bias;               /* bias on q,k,v projections */
    bool out_bias;               /* bias on attention output projection */
    bool mlp_bias;               /* bias on MLP linears */
    bool qk_norm;                /* norm on the whole projected q and k vectors (InternViT q_norm/k_norm over heads*head_dim) */
    bool qk_norm_head;           /* RMSNorm of width head_dim on every q and k head, shared by the heads (Gemma 3) */
    bool post_norms;             /* a norm after attention and after the MLP too (Gemma 2/3 "sandwich" norms) */
    int extra_params;            /* learned tensors outside the layout above, counted with the head (LLaVA-NeXT
                                    image_newline, Qwen2.5-Omni audio_bos_eos_token, a SigLIP pooling head) */
    bool layer_scale;            /* per-channel layer scale gammas (InternViT) */
    bool frozen;                 /* parameters not trained (no grads / optimizer) */
    /* How the training software runs the block (priced by the Megatron
     * target; dhp's executor refuses both): attention as separate GEMMs and
     * a fused softmax over the whole s x s score matrix, as Megatron-LM did
     * before FlashAttention (Korthikanti et al., arXiv 2205.05198, sec. 4.1);
     * dropout after the attention probabilities, the attention output and
     * the MLP output (GPT-3's attention_dropout, hidden_dropout). */
    bool unfused_attention;
    bool dropout;

    /* encoders */
    int in_channels;             /* vision: 3. audio: mel bins */
    int patch;                   /* vision patch side in pixels; audio: conv kernel (3) */
    int temporal_patch;          /* Qwen2-VL/2.5-VL video temporal patch (2); 1 otherwise */
    int image_size;              /* native side in pixels for fixed-resolution ViTs; 0 = dynamic */
    int max_positions;           /* learned absolute positions (CLIP 577, Whisper 1500); 0 = RoPE */
    bool cls_token;              /* class token prepended (CLIP, InternViT) */
    int merge;                   /* spatial merge factor m: m*m tokens -> 1 (Qwen 2, InternVL 2); 1 = none */
    int pool;                    /* audio: average-pool stride after the encoder (Qwen2-Audio 2); 1 = none */
    int window;                  /* window attention size in patches (Qwen2.5-VL: (112 px / 14)^2 = 64); 0 = none */
    int n_full_layers;           /* layers with full attention when window > 0 */
    int full_layers[MODEL_MAX_LIST];
    int proj_hidden;             /* projector MLP hidden width; 0 = single linear projector */
    int proj_in;                 /* projector input width (hidden*merge^2, or concat of layers) */
    int out_hidden;              /* projector output width == LLM hidden */
    bool proj_norm;              /* norm before the projector (Qwen merger ln_q, InternVL LayerNorm) */

    /* decoder LLM */
    int vocab;
    bool tied_embeddings;
    int rope_theta;              /* rotary base (transformers' rope_theta: 10000 default, Qwen2.5-VL 1000000) */
    int n_mrope;                 /* 3: multimodal RoPE (Qwen2-VL / 2.5-VL), rotary frequency pairs split */
    int mrope_section[MODEL_MAX_LIST];  /* t, h, w pairs (sum head_dim / 2; Qwen2.5-VL [16, 24, 24]); 0: 1-D RoPE */
    int n_cross_layers;          /* layers that are gated cross-attention blocks (Llama-3.2-Vision) */
    int cross_layers[MODEL_MAX_LIST];

    int feeds;                   /* index of the module this one feeds; -1 for the LLM */

    /* Parameter-layout details (see models/SCHEMA.md). */
    bool k_bias;                 /* bias on the k projection; defaults to qkv_bias (Whisper: false) */
    bool patch_bias;             /* bias on the patch / conv-stem embedding */
    bool pre_norm;               /* norm on the embeddings before block 0 (CLIP pre_layrnorm, Mllama layernorm_pre) */
    bool final_norm;             /* norm after the last block (CLIP post_layernorm, Whisper layer_norm; every LLM) */
    int gated_layers;            /* trailing blocks with two scalar tanh gates (Mllama global transformer) */
    int unused_layers;           /* vision: trailing blocks the checkpoint holds after the feature layer (LLaVA's
                                    vision_feature_layer -2: 1); `layers` are the ones that run. Counted in the
                                    parameters (with the head, as is the final norm after them), held, never run */
    int max_tiles;               /* Mllama tiles per image: gated tile position embeddings; 0 = none */
    int aspect_ratios;           /* Mllama aspect-ratio ids (max_aspect_ratio_id + 1) */
    int proj_norm_width;         /* width of the projector norm: hidden (Qwen ln_q) or proj_in (InternVL mlp1.0) */
    model_norm_kind proj_norm_kind;
    bool proj_bias;              /* biases on the projector linears */
    int vocab_extra;             /* embedding rows beyond vocab that the LM head lacks (Mllama: 8) */
    double norm_eps;             /* the norms' epsilon (transformers' rms_norm_eps / layer_norm_eps);
                                    0 = the norm kind's default (model_norm_eps) */
} model_module;

/* Special tokens of the model's vocabulary around its encoders' rows (the
 * processor's placeholders: where an image's merged tokens or an audio clip's
 * rows go, and the markers around an image), as transformers' configs name
 * them (image_token_id / image_token_index, video_token_id,
 * vision_start_token_id, vision_end_token_id, audio_token_index). dhp places
 * encoder rows without them; they are kept from an imported config so
 * `dhp export-weights` writes them back (-1: not known). */
typedef enum { MODEL_TOK_IMAGE, MODEL_TOK_VIDEO, MODEL_TOK_VISION_START, MODEL_TOK_VISION_END, MODEL_TOK_AUDIO,
               MODEL_NTOKENS } model_token;
const char *model_token_name(model_token t);   /* "image", ... (the model file's "tokens" keys) */

typedef struct {
    char name[MODEL_NAME_LEN];   /* "qwen2.5-vl-32b" */
    char source[256];            /* where the numbers come from (config.json URL) */
    int64_t published_params;    /* published total parameter count, 0 if unknown */
    char published_source[256];  /* where published_params comes from */
    int n_modules;
    model_module mod[MODEL_MAX_MODULES];
    int llm;                     /* index of the LLM module */
    int tokens[MODEL_NTOKENS];   /* special token ids, -1 = not known */
} model_t;

/* Loads a model from a file path or a zoo name ("qwen2.5-vl-32b"). Validates
 * every field: positive sizes, heads dividing hidden, kv_heads dividing heads,
 * layer lists in range, exactly one LLM, encoders' out_hidden == LLM hidden. */
int model_load(const char *name_or_path, model_t *m, char *err);
int model_parse_json(const char *text, const char *what, model_t *m, char *err);
/* Same from an already parsed object (a model embedded in a plan file). */
int model_from_json(const cJSON *root, const char *what, model_t *m, char *err);
int model_validate(const model_t *m, char *err);
/* Same, naming `what` (a file name) in the message instead of the model name. */
int model_validate_as(const model_t *m, const char *what, char *err);
/* Serialises to our schema (round-trips through model_parse_json). */
cJSON *model_to_json(const model_t *m);

/* Zoo: names of the built-in models. */
int model_zoo_count(void);
const char *model_zoo_name(int i);

/* The epsilon mm's norms add to the variance: norm_eps, else the kind's
 * default: RMSNorm 1e-6 (Qwen2 / Qwen2.5-VL's rms_norm_eps, and the
 * Qwen2-VL vision tower's RMSNorms, eps=1e-6 in modeling_qwen2_5_vl.py),
 * LayerNorm 1e-5 (torch.nn.LayerNorm's default, which Whisper's and CLIP's
 * layer_norm_eps keep). */
double model_norm_eps(const model_module *mm);

/* Does a step train mm's weights (gradients, optimizer state, an update)?
 * Not where the model freezes it (a frozen CLIP tower, say). */
bool model_trains(const model_module *mm);

/* Does a step run mm's backward? A frozen module other than the LLM does
 * not (nothing before it needs its input's gradient, so its forward keeps
 * nothing for one); the LLM does even when frozen, for the encoders that
 * feed it. */
bool model_runs_backward(const model_module *mm);

/* Finds a module by name or kind; -1 if absent. */
int model_find(const model_t *m, const char *module_name);
int model_find_kind(const model_t *m, model_kind kind);

/* A vision encoder's image geometry (models/geometry.c). An image of
 * gh x gw patches is stored in window order: windows in raster order, merge
 * groups in raster order inside a window, patches in raster order inside a
 * group (window side sqrt(window) patches; window 0: merge groups only);
 * model_patch_order gives each stored patch's (row, col). Its merged tokens
 * come out of the encoder in the same order; raster[j] is where merged token
 * j sits in the row-major (gh/m) x (gw/m) merged grid, the order the LLM
 * reads them in (Qwen2.5-VL's reverse_indices). A band of whole window rows
 * (model_window_band_rows merged tokens each, gw patches wide) is the same
 * order over a shorter region, so a stored range of whole window rows maps
 * onto a contiguous raster range. model_merged_order_is_raster: the stored
 * order is already raster (no windows, or a window spans the image width). */
int model_patch_order(const model_module *mm, int gh, int gw, int *rows, int *cols, char *err);
int model_merged_raster(const model_module *mm, int gh, int gw, int *raster, char *err);
int model_window_band_rows(const model_module *mm, int gw);
bool model_merged_order_is_raster(const model_module *mm, int gw);

/* Parameter counts (elements, not bytes). */
bool model_layer_is_full_attention(const model_module *mm, int layer);
bool model_layer_is_cross(const model_module *mm, int layer);
int64_t model_layer_params(const model_module *mm, int layer);  /* one block */
int64_t model_blocks_params(const model_module *mm);            /* all blocks */
int64_t model_embed_params(const model_module *mm);   /* patch/conv embed, positions, vocab embedding */
int64_t model_head_params(const model_module *mm);    /* final norm + projector, or final norm + LM head */
int64_t model_module_params(const model_module *mm);  /* blocks + embed + head */
int64_t model_total_params(const model_t *m);
int64_t model_largest_layer_params(const model_module *mm);

/* Hugging Face config.json -> our schema. Recognises the model_types that
 * model_import_hf_types() lists (multimodal ones and plain decoder LLMs).
 * Unknown types are refused by name, with that list. */
int model_import_hf(const char *config_json_text, const char *what, model_t *m, char *err);
const char *model_import_hf_types(void);

/* Models by name from the Hugging Face Hub (models/hub.c): "hf:ORG/NAME[@REVISION]".
 * model_load accepts such a reference too. */
typedef struct { char org[97], name[97], revision[97]; } model_hub_ref;
bool model_hub_is_ref(const char *s);
int model_hub_parse_ref(const char *ref, model_hub_ref *out, char *err);
/* $HF_ENDPOINT/ORG/NAME/resolve/REVISION/config.json */
int model_hub_url(const model_hub_ref *r, char *url, size_t n, char *err);
/* $XDG_CACHE_HOME/dhp, else $HOME/.cache/dhp */
int model_hub_cache_dir(char *buf, size_t n, char *err);
/* The cached config.json, else fetched (HF_TOKEN, HF_HUB_OFFLINE honoured),
 * converted, and only then cached. */
int model_hub_load(const char *ref, model_t *m, char *err);

const char *model_kind_name(model_kind k);
const char *model_ffn_kind_name(model_ffn_kind k);
const char *model_norm_kind_name(model_norm_kind k);

/* Self-attention blocks of the LLM = layers - n_cross_layers. Param helpers
 * used by the count (elements): one norm of width w; one linear in->out. */
int64_t model_norm_params(model_norm_kind k, int64_t width);
int64_t model_linear_params(int64_t in, int64_t out, bool bias);

#endif
