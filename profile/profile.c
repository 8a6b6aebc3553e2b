/* dhp profile: the backend decides what is measured (profile/profile.h). */
#include "profile/profile_int.h"

#include <string.h>

int prof_measure(const prof_opts *o, cost_profile *p, char *err)
{
    memset(p, 0, sizeof *p);
    if (!o || !o->be) return util_fail(err, UTIL_EINVAL, "profile: no backend to measure");
    p->quick = o->quick;
    return o->be == ex_backend_cpu() ? prof_measure_cpu(o, p, err) : prof_measure_device(o, p, err);
}
