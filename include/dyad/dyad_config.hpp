// SPDX-License-Identifier: Apache-2.0
/* Build configuration, for programs written against the original DYAD: its
 * headers include <dyad/dyad_config.hpp> when DYAD_HAS_CONFIG is defined.
 * Valid C and C++ (the name is the original's). Every header of this
 * implementation also compiles without DYAD_HAS_CONFIG. */
#ifndef DYAD_DYAD_CONFIG_HPP
#define DYAD_DYAD_CONFIG_HPP

/* This implementation (DYAD in C++, standalone services instead of Flux). */
#define DYAD_CPP 1
#define DYAD_VERSION_MAJOR 0
#define DYAD_VERSION_MINOR 1
#define DYAD_VERSION_PATCH 0
#define DYAD_VERSION "0.1.0"

/* The original's feature switches: no Flux, no PerfFlowAspect, no DFTracer. */
#define DYAD_PERFFLOW 0
#define DYAD_PROFILER_NONE 1
#define DYAD_LOGGER_NONE 0

#endif /* DYAD_DYAD_CONFIG_HPP */
