// SPDX-License-Identifier: Apache-2.0
// dyad_version(): the version of this libdyad.so, set by the build from the
// one version number of the project (CMakeLists.txt, project(VERSION)).
#include <dyad/dyad_version.h>

#ifndef DYAD_BUILD_VERSION
#error "DYAD_BUILD_VERSION must be defined by the build (src/common/CMakeLists.txt)"
#endif

extern "C" const char* dyad_version(void) {
    return DYAD_BUILD_VERSION;
}
