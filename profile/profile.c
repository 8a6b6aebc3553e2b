/* dhp profile: the backend decides what is measured (profile/profile.h). */
#include "profile/profile_int.h"

#include <string.h>

int prof_measure(const prof_opts *o, cost_profile *p, char *err)
{
    memset(p, 0, sizeof *p);
    if (!o || !o->be) return util_fail(err, UTIL_EINVAL, "profile: no backend to measure");
    p->quick = o->quick;
    /* --tf32: refused as dhp run refuses it (a backend without a TF32 mode);
     * on only while the TF32 grid is timed (profile/device.c) */
    int rc = o->tf32 ? ex_backend_tf32(o->be, true, err) : UTIL_OK;
    if (rc || (rc = ex_backend_tf32(o->be, false, err))) return rc;
    p->tf32 = o->tf32;
    return o->be == ex_backend_cpu() ? prof_measure_cpu(o, p, err) : prof_measure_device(o, p, err);
}
