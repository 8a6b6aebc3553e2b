/* The op table: every op kind of the step schedule with its properties,
 * declared once. The executor dispatches on the kind, the simulator prices
 * and synchronises by these properties, the trace writers draw by them. */
#include "planner/planner.h"

static const plan_op_info op_table[PLAN_NOPS] = {
    /*                          name                lane               compute collect transfer sends  grad   group */
    [PLAN_OP_FORWARD]          = { "forward",          PLAN_TRACE_COMPUTE, true,  false, false, false, false, PLAN_GROUP_NONE },
    [PLAN_OP_SEND_ACT]         = { "send_act",         PLAN_TRACE_COMM,    false, false, true,  true,  false, PLAN_GROUP_HANDOFF },
    [PLAN_OP_RECV_ACT]         = { "recv_act",         PLAN_TRACE_COMM,    false, false, true,  false, false, PLAN_GROUP_HANDOFF },
    [PLAN_OP_FORWARD_BACKWARD] = { "forward_backward", PLAN_TRACE_COMPUTE, true,  false, false, false, false, PLAN_GROUP_NONE },
    [PLAN_OP_SEND_GRAD]        = { "send_grad",        PLAN_TRACE_COMM,    false, false, true,  true,  true,  PLAN_GROUP_HANDOFF },
    [PLAN_OP_RECV_GRAD]        = { "recv_grad",        PLAN_TRACE_COMM,    false, false, true,  false, true,  PLAN_GROUP_HANDOFF },
    [PLAN_OP_BACKWARD]         = { "backward",         PLAN_TRACE_COMPUTE, true,  false, false, false, false, PLAN_GROUP_NONE },
    [PLAN_OP_GRAD_SYNC]        = { "grad_sync",        PLAN_TRACE_COMM,    false, true,  false, false, false, PLAN_GROUP_SHARD },
    /* the local sum of squares, then an all-reduce over every rank */
    [PLAN_OP_GRAD_NORM]        = { "grad_norm",        PLAN_TRACE_COMM,    true,  true,  false, false, false, PLAN_GROUP_WORLD },
    [PLAN_OP_OPTIMIZER]        = { "optimizer",        PLAN_TRACE_COMPUTE, true,  false, false, false, false, PLAN_GROUP_NONE },
    [PLAN_OP_PARAM_GATHER]     = { "param_gather",     PLAN_TRACE_COMM,    false, true,  false, false, false, PLAN_GROUP_SHARD },
    [PLAN_OP_SEND_STAGE]       = { "send_stage",       PLAN_TRACE_COMM,    false, false, true,  true,  false, PLAN_GROUP_STAGE },
    [PLAN_OP_RECV_STAGE]       = { "recv_stage",       PLAN_TRACE_COMM,    false, false, true,  false, false, PLAN_GROUP_STAGE },
    [PLAN_OP_SEND_STAGE_GRAD]  = { "send_stage_grad",  PLAN_TRACE_COMM,    false, false, true,  true,  true,  PLAN_GROUP_STAGE },
    [PLAN_OP_RECV_STAGE_GRAD]  = { "recv_stage_grad",  PLAN_TRACE_COMM,    false, false, true,  false, true,  PLAN_GROUP_STAGE },
    [PLAN_OP_EMBED_SYNC]       = { "embed_sync",       PLAN_TRACE_COMM,    false, true,  false, false, false, PLAN_GROUP_EMBED },
};

static const plan_op_info unknown_op = { "?", PLAN_TRACE_COMM, false, false, false, false, false, PLAN_GROUP_NONE };

const plan_op_info *plan_op_props(plan_op_kind k)
{
    return k >= 0 && k < PLAN_NOPS ? &op_table[k] : &unknown_op;
}

bool plan_op_retired_grad(plan_op_kind k)
{
    const plan_op_info *in = plan_op_props(k);
    return in->sends ? in->grad : !in->grad;
}

const char *plan_op_name(plan_op_kind k) { return plan_op_props(k)->name; }
