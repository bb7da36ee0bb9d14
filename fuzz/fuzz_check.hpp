// SPDX-License-Identifier: Apache-2.0
// Shared by the fuzz targets: FUZZ_CHECK states a property that must hold
// for every input; a violation aborts, which libFuzzer (and the replay
// driver) report as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            std::fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, #cond); \
            std::abort();                                                                      \
        }                                                                                      \
    } while (0)
