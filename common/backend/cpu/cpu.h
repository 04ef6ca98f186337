/* cpu.h - the CPU backend's ops, one file per group (math.c, lstm.c, xent.c,
 * rows.c, optim.c); cpu.c assembles them into the backend table. */
#ifndef FERRY_CPU_H
#define FERRY_CPU_H

#include "common/tensor/backend-impl.h"

/* ferry__cpu_<op> for every op of FERRY_BACKEND_OP_MAP (common/tensor/backend.h). */
#define FERRY_CPU_OP_DECLARE_(op, params, args, empty, check) ferry_status ferry__cpu_##op params;
FERRY_BACKEND_OP_MAP(FERRY_CPU_OP_DECLARE_)
#undef FERRY_CPU_OP_DECLARE_

#endif /* FERRY_CPU_H */
