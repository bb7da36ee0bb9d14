/* SPDX-License-Identifier: Apache-2.0 */
/* The context type, declared (defined in <dyad/core/dyad_ctx.h>). */
#ifndef DYAD_COMMON_STRUCTURES_H
#define DYAD_COMMON_STRUCTURES_H

#if defined(DYAD_HAS_CONFIG)
#include <dyad/dyad_config.hpp>
#endif

struct dyad_ctx;
typedef struct dyad_ctx dyad_ctx_t;

#endif /* DYAD_COMMON_STRUCTURES_H */
