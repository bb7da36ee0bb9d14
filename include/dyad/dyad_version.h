/* SPDX-License-Identifier: Apache-2.0 */
/* The version of the DYAD library a program runs with. */
#ifndef DYAD_DYAD_VERSION_H
#define DYAD_DYAD_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

/* "MAJOR.MINOR.PATCH" of the libdyad.so this process loaded: a string with
 * static storage, never freed, the same for every call. The version a program
 * was compiled against is DYAD_VERSION in <dyad/dyad_config.hpp>. */
const char* dyad_version(void);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_DYAD_VERSION_H */
