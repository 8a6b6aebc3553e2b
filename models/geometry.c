/* Where a vision encoder's patches and merged tokens sit in the image.
 *
 * Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel.forward)
 * takes an image's patches with each merge group's m x m patches adjacent,
 * reorders the merge groups into windows (get_window_index: windows of
 * window_size / patch_size / m merge groups a side, in raster order), runs the
 * blocks and the merger, and returns the merged tokens to raster order
 * (hidden_states[torch.argsort(window_index)]), so the language model reads
 * an image's tokens row by row. dhp stores the patches in window order (a
 * window's rows are then contiguous, which window attention and the
 * encoder's sequence split need) and puts the merged tokens back in raster
 * order on the way to the LLM (planner/handoff.c, executor/llm.c). */
#include "models/models.h"

#include <math.h>

/* The window side in patches (merge groups only when window == 0), or 0 if
 * the module's window is not a square of a multiple of its merge. */
static int window_side(const model_module *mm)
{
    int m = mm->merge > 0 ? mm->merge : 1;
    int side = mm->window > 0 ? (int)lround(sqrt((double)mm->window)) : m;
    if (mm->window > 0 && side * side != mm->window) return 0;
    return side > 0 && side % m == 0 ? side : 0;
}

int model_patch_order(const model_module *mm, int gh, int gw, int *rows, int *cols, char *err)
{
    int m = mm->merge > 0 ? mm->merge : 1, side = window_side(mm);
    if (side <= 0)
        return util_fail(err, UTIL_EINVAL, "model: module %s: window %d is not a square of a multiple of merge %d", mm->name, mm->window, m);
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

int model_window_band_rows(const model_module *mm, int gw)
{
    int m = mm->merge > 0 ? mm->merge : 1, side = window_side(mm);
    return side > 0 ? (side / m) * (gw / m) : 0;
}

bool model_merged_order_is_raster(const model_module *mm, int gw)
{
    int m = mm->merge > 0 ? mm->merge : 1, side = window_side(mm);
    return side <= m || side >= gw;   /* no windows, or one window across the image: rows stay in raster order */
}

int model_merged_raster(const model_module *mm, int gh, int gw, int *raster, char *err)
{
    int m = mm->merge > 0 ? mm->merge : 1, side = window_side(mm);
    if (side <= 0)
        return util_fail(err, UTIL_EINVAL, "model: module %s: window %d is not a square of a multiple of merge %d", mm->name, mm->window, m);
    if (gh <= 0 || gw <= 0 || gh % side || gw % side)
        return util_fail(err, UTIL_EINVAL, "model: module %s: a %dx%d-patch region is not a multiple of the window/merge side %d", mm->name, gh, gw, side);
    int u = side / m, W = gw / m, j = 0;   /* merge groups per window side; merged tokens per row */
    for (int wr = 0; wr < gh / side; wr++)
        for (int wc = 0; wc < gw / side; wc++)
            for (int ur = 0; ur < u; ur++)
                for (int uc = 0; uc < u; uc++) raster[j++] = (wr * u + ur) * W + wc * u + uc;
    return UTIL_OK;
}
